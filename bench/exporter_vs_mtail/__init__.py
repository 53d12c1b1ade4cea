"""bench/run.py's parts: the table it prints, the processes it measures, and one module per phase
(bulk and diagnose, follow and latency, scrape and flood)."""
