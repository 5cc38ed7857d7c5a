"""The queries of docs/DATASET.md and the two engines that run them on a
sweep's dataset unchanged: DuckDB (embedded) here, Spark (pyspark, local
mode) in a process of its own (`python sweep_queries.py spark DIR`, which
prints the results as JSON)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "DATASET.md"
TABLES = ["runs", "ubatches", "tokens", "tensors", "routing", "io"]


def queries() -> dict[str, str]:
    """{name: SQL} from the doc's `<!-- query: NAME -->` blocks."""
    found = re.findall(r"<!-- query: (\w+) -->\s*```sql\n(.*?)```", DOC.read_text(), re.S)
    return {name: sql.strip() for name, sql in found}


def duckdb_results(directory: Path) -> dict[str, list[dict]]:
    import duckdb

    con = duckdb.connect()
    for table in TABLES:
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet("
                    f"'{directory}/dataset/table={table}/*/*/*.parquet', hive_partitioning = true)")
    out = {}
    for name, sql in queries().items():
        rel = con.sql(sql)
        out[name] = [dict(zip(rel.columns, row)) for row in rel.fetchall()]
    return out


def glibc_snappy(into: Path) -> Path:
    """snappy-java's glibc build of its native library, from Spark's own jar.
    snappy-java takes any machine with `/lib/ld-musl-x86_64.so.1` for a musl
    one (Debian's `musl` package puts it there; `cargo xtask dist` installs
    musl-tools) and then loads its musl build, which cannot link here."""
    import pyspark
    import zipfile

    (jar,) = (Path(pyspark.__file__).parent / "jars").glob("snappy-java-*.jar")
    with zipfile.ZipFile(jar) as z:
        (into / "libsnappyjava.so").write_bytes(z.read("org/xerial/snappy/native/Linux/x86_64/libsnappyjava.so"))
    return into


def spark_results(directory: Path) -> dict[str, list[dict]]:
    import tempfile

    from pyspark.sql import SparkSession

    lib = glibc_snappy(Path(tempfile.mkdtemp(prefix="ttrace-snappy-")))
    snappy = f"-Dorg.xerial.snappy.lib.path={lib} -Dorg.xerial.snappy.lib.name=libsnappyjava.so"
    spark = (SparkSession.builder.master("local[1]").appName("ttrace-sweep-test")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", snappy).getOrCreate())
    try:
        for table in TABLES:
            spark.read.parquet(f"{directory}/dataset/table={table}").createOrReplaceTempView(table)
        return {name: [r.asDict() for r in spark.sql(sql).collect()] for name, sql in queries().items()}
    finally:
        spark.stop()


if __name__ == "__main__":
    engine, directory = sys.argv[1], Path(sys.argv[2])
    assert engine == "spark", engine
    print("RESULTS " + json.dumps(spark_results(directory), default=float))
