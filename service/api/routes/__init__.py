"""The API's routers: health, objectives and sweeps."""
