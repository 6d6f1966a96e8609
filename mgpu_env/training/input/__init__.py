"""The input: data sets (`data`), the feeds that say where their rows are (`feeds`: one data
adapter per kind, chosen by one dispatcher), the rows' order, the keep limit, and bad records
met on the way."""
