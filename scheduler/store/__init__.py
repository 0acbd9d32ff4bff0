"""The database: engine and migrations, tables, job states, the log, the spend ledger, teams, backups."""
