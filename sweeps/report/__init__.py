"""The sweep report: read-out table, statistics, contrasts, text, plots and MLflow summary runs."""
