"""The data source `pairmq`: `spark.dataSource.register(PairmqDataSource)`, then
`spark.readStream.format("pairmq")`, `spark.read`, `df.writeStream` and `df.write`.

Options are checked here, when the query is defined (in a planning process on the driver),
so a wrong one fails at once, named, instead of in every task.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pairmq.spark.options import PairmqOptionError, include_headers, parse
from pairmq.spark.reader import PairmqBatchReader, PairmqStreamReader, check_reader_options
from pairmq.spark.rows import InputSchemaError, check_input, schema_ddl
from pairmq.spark.writer import PairmqBatchWriter, PairmqStreamWriter


class PairmqDataSource(DataSource):
    """Streams of a pairmq pair as a Spark source; queues, topics and streams as a sink."""

    @classmethod
    def name(cls) -> str:
        return "pairmq"

    def schema(self) -> str:
        """The columns read: `headers` only with option includeHeaders, as Kafka's source."""
        return schema_ddl(include_headers(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse(self.options)
        check_reader_options(options, streaming=True)
        return PairmqStreamReader(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse(self.options, batch=True)
        check_reader_options(options, streaming=False)
        return PairmqBatchReader(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse(self.options)
        _check_writer(options, schema)
        return PairmqStreamWriter(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise PairmqOptionError("format pairmq only appends messages: use "
                                    "mode('append') (nothing removes what a destination holds)")
        options = parse(self.options)
        _check_writer(options, schema)
        return PairmqBatchWriter(options)


def _check_writer(options, schema: StructType) -> None:
    options.require("servers")
    options.require("destination")
    try:
        check_input((f.name, f.dataType.simpleString()) for f in schema.fields)
    except InputSchemaError as e:
        raise PairmqOptionError(str(e)) from None
