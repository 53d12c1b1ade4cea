"""Live sources read at scrape time: NVML (`nvml`), llama-server's process (`process`: its rules; read from
/proc by `procfs` or through psutil by `psutil_reader`, chosen by `process_readers`), llama-server's HTTP
endpoints (`server_http`), tied together by `live`; each produces the snapshots of `exporter.model.live`."""
