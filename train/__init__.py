"""hivig stage package: train."""
