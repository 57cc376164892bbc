"""The pipeline example on a Spark standalone cluster: a master and two workers started
from the installed PySpark (its `bin/spark-class`), all on this machine, then the same job
as in local mode with the master's URL:

    .venv/bin/python -m examples.pipeline.cluster          # `make pipeline-cluster`

Users who outgrow one machine start the master and workers on their own hosts the same way
(`spark-class org.apache.spark.deploy.master.Master`, `... deploy.worker.Worker
spark://MASTER:7077`), install pairmq with the `spark` extra on every worker, and give
`--master spark://MASTER:7077`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from examples.pipeline.broker import HOST, free_port, wait_port


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


class Cluster:
    """A standalone master and `workers` workers with one core and 1 GiB each."""

    def __init__(self, workdir: Path, workers: int = 2) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.workers = workers
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SPARK_HOME": str(spark_class().parent.parent),
                    "SPARK_LOCAL_IP": HOST, "PYSPARK_PYTHON": sys.executable,
                    "SPARK_WORKER_DIR": str(workdir / "work"),
                    "SPARK_LOG_DIR": str(workdir / "logs")}

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(spark_class()), *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        master = self._spawn("master", ["org.apache.spark.deploy.master.Master",
                                        "--host", HOST, "--port", str(self.port),
                                        "--webui-port", str(free_port())])
        wait_port(self.port, master, self.workdir / "master.log", timeout=60)
        for n in range(self.workers):
            self._spawn(f"worker-{n}", ["org.apache.spark.deploy.worker.Worker", self.url,
                                        "--host", HOST, "--cores", "1", "--memory", "1g",
                                        "--webui-port", str(free_port())])
        self._wait_workers()

    def _wait_workers(self, timeout: float = 60.0) -> None:
        log = self.workdir / "master.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.read_text(errors="replace").count("Registering worker") >= self.workers:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{self.workers} workers did not register within {timeout} s; "
                           f"see {self.workdir}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    from examples.pipeline.run import main as run_pipeline

    workdir = Path(tempfile.mkdtemp(prefix="pairmq-spark-cluster-"))
    cluster = Cluster(workdir)
    try:
        cluster.start()
        print(f"Spark standalone cluster at {cluster.url}: 2 workers (logs in {workdir})")
        return run_pipeline(["--master", cluster.url, *sys.argv[1:]])
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
