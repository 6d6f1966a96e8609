"""The input: data sets (`data`), the feeds that take their rows to the devices
(`feed`, `stream`), the rows' order, the keep limit, and bad records met on the way."""
