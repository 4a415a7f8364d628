"""PySpark jobs over the bus's records: delivery statistics, latency percentiles, archives.

Installed with the `analytics` extra (`pip install -e '.[analytics]'`); reads MongoDB through a
PySpark Python data source. The jobs themselves arrive with the analytics issue.
"""
