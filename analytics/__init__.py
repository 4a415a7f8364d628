"""PySpark jobs over the bus's records: delivery statistics, archives, traces of old messages.

Installed with the `analytics` extra (`pip install -e '.[analytics]'`), run as
`msgbus analytics stats|archive|trace` (msgbus_cli/analytics_cmd.py). MongoDB is read through
a PySpark Python data source (`mongo_source`); the archive is Parquet. Imports the msgbus core
only, like every service.
"""
