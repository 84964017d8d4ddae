"""An independent gRPC client of fsdp.v1 (issue 10, point 6): Debian's grpcio
with stubs generated now, from proto/fsdp.proto and proto/health.proto, by
grpc_tools into a temporary directory. Nothing of the project's C code is
involved, so a coordinator that this client can use speaks standard gRPC.

Usage: python_client.py ROOT ADDRESS [TOKEN_FILE [DATA]]
(TOKEN_FILE "" for none; DATA: the job's token file, which a real
coordinator requires.) Submits a job, reads it back with GetJob and asks Health/Check, printing one
line per answer ("submit <id>", "get <id> <STATE> <world_size>",
"health <STATUS>"); exits 1 with the error on any failure."""
import os
import subprocess
import sys
import tempfile


def main():
    root, address = sys.argv[1], sys.argv[2]
    token_file = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
    data = sys.argv[4] if len(sys.argv) > 4 else None
    with tempfile.TemporaryDirectory(prefix="fsdp-pyclient-") as out:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", os.path.join(root, "proto"),
                        "--python_out=" + out, "--grpc_python_out=" + out, "fsdp.proto", "health.proto"],
                       check=True)
        sys.path.insert(0, out)
        import grpc
        import fsdp_pb2
        import fsdp_pb2_grpc
        import health_pb2
        import health_pb2_grpc

        md = []
        if token_file:
            with open(token_file) as f:
                md = [("authorization", "Bearer " + f.read().strip())]
        with grpc.insecure_channel(address) as ch:
            coord = fsdp_pb2_grpc.CoordinatorStub(ch)
            options = [fsdp_pb2.Option(section="model", key="model", value="tiny"),
                       fsdp_pb2.Option(section="train", key="steps", value="5")]
            if data:
                options.append(fsdp_pb2.Option(section="data", key="data", value=data))
            spec = fsdp_pb2.JobSpec(name="py", world_size=2, options=options)
            rep = coord.SubmitJob(fsdp_pb2.SubmitJobRequest(spec=spec, request_id="py-1"),
                                  metadata=md, timeout=10)
            print("submit", rep.job_id)
            got = coord.GetJob(fsdp_pb2.GetJobRequest(job_id=rep.job_id), metadata=md, timeout=10)
            print("get", got.job.job_id, fsdp_pb2.JobState.Name(got.job.state), got.job.spec.world_size)
            health = health_pb2_grpc.HealthStub(ch)
            h = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            print("health", health_pb2.HealthCheckResponse.ServingStatus.Name(h.status))
            sys.stdout.flush()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line for the C test to show
        print("python client failed:", repr(e))
        sys.exit(1)
