"""Live sources read at scrape time: NVML (`nvml`), /proc (`procfs`, `server_cmdline`), llama-server's HTTP
endpoints (`server_http`), tied together and merged with the log's state by `live`."""
