"""Evaluation of a model: perplexity by protocol, bootstrap intervals, the results file and its views, searches of a method's settings."""
