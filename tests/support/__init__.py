"""What tests share: settings and stores, live processes, builders of events and keys, readers of
/metrics and the database, hostile values, the fake judge server, and paths."""
