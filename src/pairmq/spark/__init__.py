"""The PySpark data source `pairmq` (extra `spark`): read streams, write to any destination,
exactly once through failovers. docs/spark.md.

    from pairmq.spark import PairmqDataSource
    spark.dataSource.register(PairmqDataSource)
    df = (spark.readStream.format("pairmq")
          .option("servers", "failover:(stomp://h1:61613,stomp://h2:61614)")
          .option("stream", "orders").option("startingOffsets", "earliest").load())

Layering: this package imports only `pairmq.client` (and, through it, the protocol).
"""

from pairmq.spark.connecting import PairmqError
from pairmq.spark.options import OPTIONS, PairmqOptionError
from pairmq.spark.plan import DataLossError
from pairmq.spark.source import PairmqDataSource

__all__ = ["OPTIONS", "DataLossError", "PairmqDataSource", "PairmqError", "PairmqOptionError"]
