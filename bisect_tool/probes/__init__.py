"""probes stage."""
