"""The input of training, from data sets to the rows a step reads.

It holds the data sets (`data`), the feeds that say where their rows are (`feeds`: one data
adapter per kind, chosen by one dispatcher), the rows' order, the keep limit, and bad records
met on the way."""
