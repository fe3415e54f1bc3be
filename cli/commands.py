"""Import every module that adds commands to the `probe` app (one line each)."""
