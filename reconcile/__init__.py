"""Settling effects whose outcome is not known: classification of upstream answers."""
