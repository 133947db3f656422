"""hivig stage package: data_gen."""
