"""Request traces: one CSV format, seeded generators, converters for public production traces,
a downloader and tools to cut and reshape them. See traces/README.md."""
