"""hivig stage package: serve."""
