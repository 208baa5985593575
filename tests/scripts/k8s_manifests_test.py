#!/usr/bin/python3
"""Tests of deploy/k8s/validate.sh: every overlay of the real tree renders and passes, the
rendered objects say what docs/deploy.md says they do, and a copy broken on purpose (a misspelt
field, replicas beside the HPA, :latest, ...) fails, naming the field. Also runs the blocks of
docs/deploy.md marked `<!-- tested offline -->`, checks that every flag the Deployment
passes is one gradserve-server has, and, where CTest names the binaries (GRADSERVE_SERVER,
GRADSERVE_CLI), starts the server with the Deployment's own args (TLS and tokens from files made
here, on 127.0.0.1): the admin address answers health, a dns:/// client with its token pings,
and SIGTERM drains it to exit 0.

Exits 77 (skipped) without kubectl, node or the checker's npm packages
(`npm ci --prefix deploy/k8s/validate`).

Usage: k8s_manifests_test.py [REPO_ROOT] [unittest arguments: a class or test name]
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

ROOT = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
VALIDATE = os.path.join(K8S, "validate.sh")


def skip_reason():
    if shutil.which("kubectl") is None:
        return "kubectl not found (it renders the overlays)"
    if shutil.which("node") is None:
        return "node not found: apt-get install nodejs npm"
    for package in ("typescript", "kubernetes-types", "yaml"):
        if not os.path.isdir(os.path.join(K8S, "validate", "node_modules", package)):
            return "the checker's npm packages are missing: npm ci --prefix deploy/k8s/validate"
    return None


def run(*args):
    return subprocess.run([VALIDATE, *args], capture_output=True, text=True, timeout=120)


class RealTreeTest(unittest.TestCase):
    """The manifests as committed: one render shared by the tests of this class."""

    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp(prefix="k8s_rendered_")
        cls.result = run("--out", cls.out)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out)

    def rendered(self, overlay):
        with open(os.path.join(self.out, overlay + ".yaml"), encoding="utf-8") as f:
            return f.read()

    def test_every_overlay_renders_and_passes(self):
        self.assertEqual(self.result.returncode, 0, self.result.stdout + self.result.stderr)
        self.assertIn("rendered overlays/cpu: 7 objects", self.result.stdout)
        self.assertIn("rendered overlays/gpu: 7 objects", self.result.stdout)
        self.assertIn("rendered overlays/inflight: 7 objects", self.result.stdout)
        self.assertIn("validate.sh: every overlay renders and passes", self.result.stdout)

    def test_the_cpu_overlay_is_what_the_docs_say(self):
        cpu = self.rendered("cpu")
        for text in ("name: gradserve-headless", "clusterIP: None", "type: ClusterIP",
                     "pod-security.kubernetes.io/enforce: restricted",
                     "image: gradserve:0.1.0", "--max_connection_age=30s",
                     "--grace_period=25s", "terminationGracePeriodSeconds: 65",
                     "automountServiceAccountToken: false", "type: RuntimeDefault",
                     "maxUnavailable: 1", "topologySpreadConstraints:", "port: 50052",
                     "secretName: gradserve-tls", "secretName: gradserve-tokens",
                     "namespace: gradserve\n"):
            self.assertIn(text, cpu)
        self.assertNotIn("replicas:", cpu.replace("minReplicas", "").replace("maxReplicas", ""))
        self.assertNotIn("--devices=cuda", cpu)
        self.assertNotIn("nvidia.com/gpu", cpu)

    def test_prometheus_scrapes_the_metrics_port(self):
        cpu = self.rendered("cpu")
        port = re.search(r"--metrics_listen=0\.0\.0\.0:(\d+)", cpu).group(1)
        for text in ('prometheus.io/scrape: "true"', f'prometheus.io/port: "{port}"',
                     "prometheus.io/path: /metrics", f"containerPort: {port}",
                     f"port: {port}", 'gradserve-metrics: "true"'):
            self.assertIn(text, cpu)

    def test_the_inflight_overlay_scales_on_calls_in_flight(self):
        inflight = self.rendered("inflight")
        for text in ("kind: HorizontalPodAutoscaler", "type: Pods", "name: gradserve_in_flight",
                     "type: AverageValue", 'averageValue: "16"', "averageUtilization: 70"):
            self.assertIn(text, inflight)
        # The adapter's rule serves the metric the HPA asks for, from the server's gauge.
        with open(os.path.join(K8S, "overlays", "inflight", "prometheus-adapter-rules.yaml"),
                  encoding="utf-8") as f:
            rules = f.read()
        self.assertIn("seriesQuery: 'gradserve_in_flight{", rules)
        self.assertIn('as: "gradserve_in_flight"', rules)

    def test_the_gpu_overlay_asks_for_a_gpu(self):
        gpu = self.rendered("gpu")
        for text in ("--devices=cuda", 'nvidia.com/gpu: "1"', "image: gradserve:0.1.0-cuda13.0",
                     'nvidia.com/gpu.present: "true"', "key: nvidia.com/gpu",
                     "namespace: gradserve-gpu\n", "maxReplicas: 4"):
            self.assertIn(text, gpu)


class DocsTest(unittest.TestCase):
    def test_the_offline_blocks_of_docs_deploy_md_run(self):
        with open(os.path.join(ROOT, "docs", "deploy.md"), encoding="utf-8") as f:
            blocks = re.findall(r"<!-- tested offline -->\n(?:<!-- doc-test:[^\n]*-->\n)?```sh\n(.*?)```",
                                f.read(), re.S)
        self.assertGreaterEqual(len(blocks), 3)
        with tempfile.TemporaryDirectory(prefix="k8s_docs_") as tmp:
            # The repository's deploy/ beside a scratch folder: what a block writes stays there.
            os.symlink(os.path.join(ROOT, "deploy"), os.path.join(tmp, "deploy"))
            for block in blocks:
                result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp,
                                        capture_output=True, text=True, timeout=120)
                self.assertEqual(result.returncode, 0,
                                 block + result.stdout + result.stderr)

    def test_the_deployment_passes_only_flags_the_server_has(self):
        with open(os.path.join(ROOT, "server", "process", "main.cc"), encoding="utf-8") as f:
            flags = set(re.findall(r"ABSL_FLAG\([^,]+,\s*(\w+)\s*,", f.read()))
        self.assertIn("grace_period", flags)
        for overlay in ("cpu", "gpu", "inflight"):
            rendered = subprocess.run(["kubectl", "kustomize",
                                       os.path.join(K8S, "overlays", overlay)],
                                      capture_output=True, text=True, timeout=60, check=True)
            args = re.findall(r"^\s+- --(\w+)=", rendered.stdout, re.M)
            self.assertGreater(len(args), 10)
            for arg in args:
                self.assertIn(arg, flags, f"overlays/{overlay} passes --{arg}")


@unittest.skipUnless(os.environ.get("GRADSERVE_SERVER") and os.environ.get("GRADSERVE_CLI")
                     and shutil.which("openssl"),
                     "GRADSERVE_SERVER, GRADSERVE_CLI (set by CTest) or openssl missing")
class DeploymentArgsTest(unittest.TestCase):
    """gradserve-server started with the cpu overlay's args, as the pod starts it."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="k8s_args_")
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

        def openssl(*args):
            subprocess.run(["openssl", *args], cwd=self.tmp, check=True, capture_output=True)
        openssl("req", "-x509", *key, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=test-ca")
        openssl("req", *key, "-keyout", "tls.key", "-out", "server.csr", "-subj", "/CN=gradserve")
        with open(os.path.join(self.tmp, "server.ext"), "w", encoding="utf-8") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "server.ext")
        token = os.urandom(16).hex()
        digest = subprocess.run(["sha256sum"], input=token, capture_output=True, text=True,
                                check=True).stdout.split()[0]
        with open(os.path.join(self.tmp, "tokens"), "w", encoding="utf-8") as f:
            f.write(f"trainer-1 acme {digest}\n")
        with open(os.path.join(self.tmp, "trainer-1.token"), "w", encoding="utf-8") as f:
            f.write(token)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def deployment_args(self):
        rendered = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, "overlays", "cpu")],
                                  capture_output=True, text=True, timeout=60, check=True).stdout
        args = []
        for arg in re.findall(r"^\s+- (--\w+=\S+)$", rendered, re.M):
            # The pod's paths and addresses, moved here: the Secrets' folders to this test's
            # files, 0.0.0.0 to loopback on free ports.
            arg = arg.replace("/etc/gradserve/tls/", self.tmp + "/")
            arg = arg.replace("/etc/gradserve/tokens/", self.tmp + "/")
            arg = re.sub(r"^(--(admin_|metrics_)?listen)=0\.0\.0\.0:\d+$", r"\1=127.0.0.1:0",
                         arg)
            args.append(arg)
        self.assertIn("--listen=127.0.0.1:0", args)
        self.assertIn("--admin_listen=127.0.0.1:0", args)
        self.assertIn("--metrics_listen=127.0.0.1:0", args)
        return args

    def test_the_server_starts_serves_and_drains_with_the_deployments_args(self):
        log_path = os.path.join(self.tmp, "server.log")
        with open(log_path, "w", encoding="utf-8") as log:
            server = subprocess.Popen([os.environ["GRADSERVE_SERVER"], *self.deployment_args()],
                                      stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            text = ""
            while "listening on" not in text and time.monotonic() < deadline:
                self.assertIsNone(server.poll(), "the server exited")
                time.sleep(0.1)
                with open(log_path, encoding="utf-8") as f:
                    text = f.read()
            self.assertIn("aged out after 30s (grace 1m)", text)
            self.assertIn("tls: on; tokens: 1 clients of 1 tenants", text)
            admin = re.search(r"plaintext\): (127\.0\.0\.1:\d+)", text).group(1)
            port = re.search(r"listening on 127\.0\.0\.1:(\d+)", text).group(1)

            def cli(*args):
                return subprocess.run([os.environ["GRADSERVE_CLI"], *args], capture_output=True,
                                      text=True, timeout=60)
            health = cli("health", "--target=" + admin)
            self.assertEqual(health.returncode, 0, health.stdout + health.stderr)
            self.assertIn("SERVING", health.stdout)
            metrics = re.search(r"plaintext HTTP\): (127\.0\.0\.1:\d+)", text).group(1)
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
                scraped = response.read().decode()
            self.assertIn("# TYPE gradserve_in_flight gauge", scraped)
            self.assertIn('gradserve_build_info{version="', scraped)
            ping = cli("ping", f"--target=dns:///localhost:{port}",
                       "--tls_ca=" + os.path.join(self.tmp, "ca.pem"),
                       "--token_file=" + os.path.join(self.tmp, "trainer-1.token"))
            self.assertEqual(ping.returncode, 0, ping.stdout + ping.stderr)
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=40), 0)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        with open(log_path, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("every call in flight finished; exiting", text)
        with open(os.path.join(self.tmp, "trainer-1.token"), encoding="utf-8") as f:
            token = f.read()
        self.assertNotIn(token, text)  # a secret never reaches a log line
        self.assertNotIn(token, scraped)  # nor a metric


@unittest.skipUnless(shutil.which("openssl"), "openssl missing")
class SecretsTest(unittest.TestCase):
    def test_the_docs_secrets_hold_the_files_the_deployment_reads(self):
        # docs/deploy.md's `kubectl create secret` lines, run with --dry-run=client (no cluster)
        # on stand-in files: the Secrets' keys become the file names under the mounts.
        with open(os.path.join(ROOT, "docs", "deploy.md"), encoding="utf-8") as f:
            lines = re.findall(r"^kubectl -n gradserve create secret .*$", f.read(), re.M)
        self.assertEqual(len(lines), 2, lines)
        files = {}
        with tempfile.TemporaryDirectory(prefix="k8s_secrets_") as tmp:
            # kubectl checks that the certificate and key are PEM and a pair.
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server-key.pem",
                            "-out", "server.pem", "-days", "2", "-subj", "/CN=gradserve"],
                           cwd=tmp, check=True, capture_output=True)
            with open(os.path.join(tmp, "tokens.txt"), "w", encoding="utf-8") as f:
                f.write("# NAME TENANT SHA256_HEX\n")
            for line in lines:
                result = subprocess.run(line.split() + ["--dry-run=client", "-o", "json"],
                                        cwd=tmp, capture_output=True, text=True, timeout=60)
                self.assertEqual(result.returncode, 0, line + result.stderr)
                secret = json.loads(result.stdout)
                files[secret["metadata"]["name"]] = sorted(secret["data"])
        self.assertEqual(files, {"gradserve-tls": ["tls.crt", "tls.key"],
                                 "gradserve-tokens": ["tokens"]})
        rendered = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, "overlays", "cpu")],
                                  capture_output=True, text=True, timeout=60, check=True).stdout
        for arg in ("--tls_cert=/etc/gradserve/tls/tls.crt", "--tls_key=/etc/gradserve/tls/tls.key",
                    "--auth_tokens_file=/etc/gradserve/tokens/tokens"):
            self.assertIn(arg, rendered)
        for mount in ("mountPath: /etc/gradserve/tls", "mountPath: /etc/gradserve/tokens"):
            self.assertIn(mount, rendered)


class BrokenCopyTest(unittest.TestCase):
    """A copy of deploy/k8s (less the checker's node_modules), broken one way per test."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="k8s_manifests_")
        shutil.copytree(os.path.join(K8S, "base"), os.path.join(self.tmp, "base"))
        shutil.copytree(os.path.join(K8S, "overlays"), os.path.join(self.tmp, "overlays"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def replace(self, rel, old, new):
        path = os.path.join(self.tmp, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(text.count(old), 1, f"{old!r} in {rel}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new))

    def check_fails(self, *expected):
        result = run("--k8s-dir", self.tmp)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        for text in expected:
            self.assertIn(text, result.stdout)
        self.assertIn("validate.sh: FAILED", result.stderr)
        return result.stdout

    def test_the_copy_passes(self):
        result = run("--k8s-dir", self.tmp)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_a_misspelt_probe_field_fails(self):
        self.replace("base/deployment.yaml", "            periodSeconds: 5\n",
                     "            periodSecond: 5\n")
        out = self.check_fails(
            "FAIL cpu: Deployment gradserve/gradserve: "
            "spec.template.spec.containers[0].readinessProbe.periodSecond: ",
            "'periodSecond' does not exist in type 'Probe'",
            "Did you mean to write 'periodSeconds'?")
        self.assertIn("FAIL gpu: Deployment gradserve-gpu/gradserve: "
                      "spec.template.spec.containers[0].readinessProbe.periodSecond", out)

    def test_a_misspelt_security_field_fails(self):
        self.replace("base/deployment.yaml", "            runAsNonRoot: true\n",
                     "            runAsNonroot: true\n")
        self.check_fails(
            "spec.template.spec.containers[0].securityContext.runAsNonroot: ",
            "'runAsNonroot' does not exist in type 'SecurityContext'",
            "Did you mean to write 'runAsNonRoot'?")

    def test_a_misspelt_field_of_an_overlay_patch_fails(self):
        self.replace("overlays/gpu/deployment-gpu.yaml", "      tolerations:\n",
                     "      toleration:\n")
        out = self.check_fails("FAIL gpu: Deployment gradserve-gpu/gradserve: "
                               "spec.template.spec.toleration: ")
        self.assertNotIn("FAIL cpu", out)

    def test_a_wrong_type_fails(self):
        self.replace("base/deployment.yaml", "failureThreshold: 6", 'failureThreshold: "six"')
        self.check_fails("livenessProbe.failureThreshold: Type 'string' is not assignable "
                         "to type 'number'")

    def test_replicas_beside_the_hpa_fail(self):
        self.replace("base/deployment.yaml", "  selector:\n    matchLabels:",
                     "  replicas: 2\n  selector:\n    matchLabels:")
        self.check_fails("spec.replicas: must be left out: a HorizontalPodAutoscaler owns")

    def test_latest_fails(self):
        self.replace("base/kustomization.yaml", 'newTag: "0.1.0"', "newTag: latest")
        self.check_fails('.image: "gradserve:latest" needs a tag other than latest')

    def test_requests_below_limits_fail(self):
        self.replace("base/deployment.yaml", "            requests:\n              cpu: \"4\"",
                     "            requests:\n              cpu: \"2\"")
        self.check_fails("requests.cpu (2) must equal limits.cpu (4)")

    def test_a_restricted_pod_security_violation_fails(self):
        self.replace("base/deployment.yaml", "            allowPrivilegeEscalation: false\n",
                     "")
        self.replace("base/deployment.yaml", "          type: RuntimeDefault\n",
                     "          type: Unconfined\n")
        self.check_fails("securityContext.allowPrivilegeEscalation: must be false",
                         "securityContext.seccompProfile.type: must be RuntimeDefault")

    def test_a_readiness_probe_that_flaps_fails(self):
        self.replace("base/deployment.yaml", "failureThreshold: 3\n", "failureThreshold: 1\n")
        self.check_fails("readinessProbe.failureThreshold: must be 2 or more")

    def test_a_grace_period_shorter_than_the_drain_fails(self):
        self.replace("base/deployment.yaml", "--grace_period=25s", "--grace_period=40s")
        self.check_fails("terminationGracePeriodSeconds: 65 must exceed the preStop sleep "
                         "(35 s) plus --grace_period (40 s)")

    def test_a_prestop_sleep_shorter_than_the_connection_age_fails(self):
        self.replace("base/deployment.yaml", "--max_connection_age=30s", "--max_connection_age=5m")
        self.check_fails("the sleep (35 s) must outlast --max_connection_age (5m, +10%)")

    def test_a_pdb_with_min_available_fails(self):
        self.replace("base/pdb.yaml", "maxUnavailable: 1", "minAvailable: 1")
        self.check_fails("PodDisruptionBudget gradserve/gradserve: spec: use maxUnavailable")

    def test_an_overlay_that_does_not_render_fails(self):
        self.replace("overlays/cpu/kustomization.yaml", "  - ../../base\n",
                     "  - ../../base\n  - missing.yaml\n")
        self.check_fails("FAIL cpu: kubectl kustomize overlays/cpu:")


if __name__ == "__main__":
    reason = skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        sys.exit(77)
    unittest.main(verbosity=2)
