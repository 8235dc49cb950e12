"""Composing the baseline footprint and the strategies' transforms into a Plan."""
