"""Recipes: the bundled TOML files, and the code that reads and checks them."""
