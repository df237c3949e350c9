"""The run owner: one bisect (or locate, or one candidate's probe) from its request to its end,
through the one engine."""
