"""Shared test helpers: random checkpoints and weights, toy models, kernel-check functions, fixtures.

Test modules import from here, never from one another (a test of the suite checks it).
"""
