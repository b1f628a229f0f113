"""Runs side by side: comparisons, labels, published claims, the results page."""
