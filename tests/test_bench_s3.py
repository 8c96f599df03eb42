"""benchmarks/bench_s3.py's harness: moto's server and the latency proxy in their own processes, and a tiny run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_s3  # noqa: E402


@pytest.mark.slow
def test_the_proxy_adds_its_latency_to_each_request_and_passes_bytes_intact() -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: many chunks each way
    with bench_s3.s3_behind_proxy(latency_ms=60) as endpoints:
        import boto3

        direct = endpoints.client()
        direct.create_bucket(Bucket="proxy")
        proxied = boto3.client("s3", endpoint_url=endpoints.proxied, aws_access_key_id=bench_s3.KEY,
                               aws_secret_access_key=bench_s3.SECRET, region_name="us-east-1")
        proxied.put_object(Bucket="proxy", Key="big.bin", Body=payload)
        assert direct.get_object(Bucket="proxy", Key="big.bin")["Body"].read() == payload, "the upload went through whole"
        assert proxied.get_object(Bucket="proxy", Key="big.bin")["Body"].read() == payload, "and the download"
        timings = {}
        for name, client in (("direct", direct), ("proxied", proxied)):
            client.head_object(Bucket="proxy", Key="big.bin")  # the connection is open: the loop times requests alone
            started = time.perf_counter()
            for _ in range(5):
                client.head_object(Bucket="proxy", Key="big.bin")
            timings[name] = (time.perf_counter() - started) / 5
    assert timings["proxied"] >= 0.060, timings
    assert timings["proxied"] - timings["direct"] < 0.060 * 2, f"one delay per request, not per chunk: {timings}"


@pytest.mark.slow
def test_a_tiny_run_prints_its_tables(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/bench_s3.py", "--parts", "build,epoch", "--count", "12", "--concurrency", "4",
               "--workers", "1", "--latency-ms", "5", "--fast-server", "--work", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.startswith("command: python benchmarks/bench_s3.py --parts build,epoch --count 12")
    assert "GETs answered by the caching front" in out, "the front before moto: every other request went through it to moto"
    assert "### Building 12 ImageNet-like JPEGs" in out and "| local folder | - |" in out and "### One epoch of 12 JPEGs" in out
    row = next(line for line in out.splitlines() if line.startswith("| s3://build/photos | 4 |"))  # the concurrency asked
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[5]) > 0 and float(cells[6]) > 0, "the build's and the server's CPU per image were measured"
    assert "raw (one GET per sample)" in out and "staged database" in out


def test_unknown_parts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_s3.main(["--parts", "build,bogus"])
    assert exited.value.code == 2 and "unknown bogus" in capsys.readouterr().err
