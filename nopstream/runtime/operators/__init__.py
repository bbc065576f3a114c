"""Operators: small classes with explicit callbacks, one per operator type of the model."""
