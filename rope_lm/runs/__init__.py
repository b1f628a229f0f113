"""Runs: settings resolved once, the pipeline of a train run, run folders, resumes, fine-tunes, opening a trained model."""
