"""Log side of the pipeline: tail a file, parse lines into events."""
