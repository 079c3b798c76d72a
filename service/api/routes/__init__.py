"""The API's routers: health, objectives, sweeps and their history."""
