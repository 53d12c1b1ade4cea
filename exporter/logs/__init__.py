"""The log box: line sources (a file's tailer, standard input, the journal) and the parse of their lines
into events, split by a router's `[PORT]` prefix. Nothing here imports the model: `exporter.pipeline`
applies the events to it."""
