"""bisect: find the vLLM commit that introduced or fixed an intermittent kernel bug."""

__version__ = "0.1.0"
