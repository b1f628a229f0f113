"""Chores every layer shares: errors, atomic files, markdown tables, registries, typed settings."""
