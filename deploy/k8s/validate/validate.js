#!/usr/bin/env node
// Checks rendered Kubernetes manifests offline (deploy/k8s/validate.sh renders them):
//
// 1. The schema. Each object becomes a TypeScript object literal typed with its kind's
//    interface from kubernetes-types (generated from the Kubernetes API's OpenAPI schema),
//    and the TypeScript compiler checks it: a field the API does not have (TypeScript's
//    excess-property check, at every depth: `periodSecond`, `runAsNonroot`), a value of the
//    wrong type, a required field missing, an apiVersion that does not go with the kind.
//    Unlike the API server, which drops unknown fields with a warning at most, this fails.
//    Quantities must be strings ("4", "8Gi"), as kubernetes-types types them.
// 2. gradserve's own rules (docs/deploy.md): the restricted Pod Security Standard, requests
//    equal to limits, no :latest, no replicas beside an HPA, probes that do not flap, the
//    termination grace period against preStop and --grace_period, a PDB with maxUnavailable.
//
// Usage: validate.js FILE.yaml...   (each file: the objects of one overlay, `---` between
// them; the file's name, less .yaml, labels its errors). Exit status 0 if every object
// passes, 1 if any fails (each failure on a line of its own), 2 on bad usage.
"use strict";

const fs = require("fs");
const path = require("path");
const ts = require("typescript");
const YAML = require("yaml");

const TYPES_DIR = path.join(__dirname, "node_modules", "kubernetes-types");

// "apps/v1" -> "kubernetes-types/apps/v1"; "v1" -> core/v1; "networking.k8s.io/v1" ->
// networking/v1 (the package names each group's folder by its first label).
function typesModule(apiVersion) {
  const parts = String(apiVersion).split("/");
  if (parts.length === 1) return "core/" + parts[0];
  let group = parts[0].split(".")[0];
  if (parts[0] === "internal.apiserver.k8s.io") group = "apiserverinternal";
  return group + "/" + parts[1];
}

function exportsInterface(moduleRel, kind) {
  const file = path.join(TYPES_DIR, moduleRel + ".d.ts");
  if (!/^[A-Za-z0-9]+$/.test(kind) || !fs.existsSync(file)) return false;
  return new RegExp("^export interface " + kind + " \\{", "m").test(fs.readFileSync(file, "utf8"));
}

// The JSON path of the property or element a diagnostic points at:
// spec.template.spec.containers[0].readinessProbe.periodSecond
function jsonPath(sourceFile, pos) {
  let node = sourceFile;
  for (;;) {
    const child = node.getChildren(sourceFile).find(
        (c) => c.getStart(sourceFile) <= pos && pos < c.getEnd());
    if (!child) break;
    node = child;
  }
  const out = [];
  for (let n = node; n && n.kind !== ts.SyntaxKind.VariableDeclaration; n = n.parent) {
    const parent = n.parent;
    if (n.kind === ts.SyntaxKind.PropertyAssignment) {
      const name = n.name.text;
      out.unshift(/^[A-Za-z_$][\w$]*$/.test(name) ? "." + name : "[" + JSON.stringify(name) + "]");
    } else if (parent && parent.kind === ts.SyntaxKind.ArrayLiteralExpression) {
      out.unshift("[" + parent.elements.indexOf(n) + "]");
    }
  }
  return out.join("").replace(/^\./, "") || "(the object)";
}

// A TypeScript literal of a JSON value, with the keys that are identifiers unquoted, so that
// the compiler offers its "Did you mean to write 'periodSeconds'?" for a misspelt one.
function literal(value, indent) {
  const inner = indent + "  ";
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return "[\n" + value.map((v) => inner + literal(v, inner)).join(",\n") + "\n" + indent + "]";
  }
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value);
    if (keys.length === 0) return "{}";
    return "{\n" + keys.map((k) => inner + (/^[A-Za-z_$][\w$]*$/.test(k) ? k : JSON.stringify(k)) +
        ": " + literal(value[k], inner)).join(",\n") + "\n" + indent + "}";
  }
  return JSON.stringify(value);
}

function objectName(o) {
  const m = (o && o.metadata) || {};
  return (o && o.kind) + " " + (m.namespace ? m.namespace + "/" : "") + m.name;
}

// --- 1. the schema ---------------------------------------------------------------------------
function checkSchemas(objects, report) {
  const virtual = new Map();  // file name -> {text, label, object}
  objects.forEach(({ label, object }, i) => {
    const where = label + ": " + objectName(object);
    if (!object || typeof object !== "object" || Array.isArray(object)) {
      report(label + ": document " + (i + 1) + ": not an object");
      return;
    }
    const moduleRel = typesModule(object.apiVersion);
    if (!exportsInterface(moduleRel, object.kind)) {
      report(where + ": apiVersion " + JSON.stringify(object.apiVersion) + " kind " +
             JSON.stringify(object.kind) + " is not a Kubernetes 1.30 API type");
      return;
    }
    const file = path.join(__dirname, "rendered", String(i) + ".ts");
    const text = "import type { " + object.kind + " as T } from \"kubernetes-types/" + moduleRel +
                 "\";\nexport const o: T = " + literal(object, "") + ";\n";
    virtual.set(file, { text, where });
  });
  if (virtual.size === 0) return;

  const options = {
    strict: true, noEmit: true, skipLibCheck: true, types: [], lib: ["lib.es5.d.ts"],
    target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
  };
  const host = ts.createCompilerHost(options);
  const { getSourceFile, fileExists, readFile } = host;
  host.getSourceFile = (name, lang, ...rest) => virtual.has(name)
      ? ts.createSourceFile(name, virtual.get(name).text, lang, true)
      : getSourceFile.call(host, name, lang, ...rest);
  host.fileExists = (name) => virtual.has(name) || fileExists.call(host, name);
  host.readFile = (name) => virtual.has(name) ? virtual.get(name).text : readFile.call(host, name);
  const program = ts.createProgram([...virtual.keys()], options, host);
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const message = ts.flattenDiagnosticMessageText(d.messageText, " ");
    if (!d.file || !virtual.has(d.file.fileName)) {
      report("typescript: " + message);
      continue;
    }
    report(virtual.get(d.file.fileName).where + ": " + jsonPath(d.file, d.start) + ": " + message);
  }
}

// --- 2. gradserve's rules ----------------------------------------------------------------------
function durationSeconds(text) {  // "25s", "1m30s", "2m": absl's form, as --grace_period takes
  let total = 0;
  const re = /(\d+(?:\.\d+)?)(h|m|s|ms)/g;
  let m, seen = "";
  while ((m = re.exec(text)) !== null) {
    total += Number(m[1]) * { h: 3600, m: 60, s: 1, ms: 0.001 }[m[2]];
    seen += m[0];
  }
  return seen === text && text !== "" ? total : NaN;
}

function flag(args, name) {
  const prefixes = ["--" + name + "=", "--" + name.replace(/_/g, "-") + "="];
  for (const a of args || []) {
    for (const p of prefixes) if (String(a).startsWith(p)) return String(a).slice(p.length);
  }
  return undefined;
}

function checkPod(where, podSpec, report) {
  const pod = podSpec || {};
  const psc = pod.securityContext || {};
  const bad = (field, why) => report(where + ": " + field + ": " + why);
  // The restricted Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards).
  for (const f of ["hostNetwork", "hostPID", "hostIPC"]) {
    if (pod[f]) bad("spec.template.spec." + f, "not allowed by the restricted Pod Security Standard");
  }
  for (const [i, v] of (pod.volumes || []).entries()) {
    if (v.hostPath) bad(`spec.template.spec.volumes[${i}].hostPath`, "not allowed by the restricted Pod Security Standard");
  }
  if (pod.automountServiceAccountToken !== false) {
    bad("spec.template.spec.automountServiceAccountToken", "must be false: the server calls no Kubernetes API, so no token in the pod");
  }
  const containers = [...(pod.initContainers || []).map((c, i) => ["initContainers", i, c]),
                      ...(pod.containers || []).map((c, i) => ["containers", i, c])];
  for (const [list, i, c] of containers) {
    const at = `spec.template.spec.${list}[${i}]`;
    const sc = c.securityContext || {};
    const caps = sc.capabilities || {};
    const pss = "the restricted Pod Security Standard needs it";
    if (!(sc.runAsNonRoot === true || (psc.runAsNonRoot === true && sc.runAsNonRoot !== false))) {
      bad(at + ".securityContext.runAsNonRoot", "must be true (here or in the pod's securityContext): " + pss);
    }
    if (sc.runAsUser === 0 || (sc.runAsUser === undefined && psc.runAsUser === 0)) {
      bad(at + ".securityContext.runAsUser", "must not be 0: " + pss);
    }
    const seccomp = (sc.seccompProfile || psc.seccompProfile || {}).type;
    if (seccomp !== "RuntimeDefault" && seccomp !== "Localhost") {
      bad(at + ".securityContext.seccompProfile.type", "must be RuntimeDefault or Localhost (here or in the pod's securityContext): " + pss);
    }
    if (sc.allowPrivilegeEscalation !== false) bad(at + ".securityContext.allowPrivilegeEscalation", "must be false: " + pss);
    if (sc.privileged) bad(at + ".securityContext.privileged", "must not be true: " + pss);
    if (!(caps.drop || []).includes("ALL")) bad(at + ".securityContext.capabilities.drop", "must include ALL: " + pss);
    for (const cap of caps.add || []) {
      if (cap !== "NET_BIND_SERVICE") bad(at + ".securityContext.capabilities.add", cap + " is not allowed: " + pss);
    }
    for (const [j, p] of (c.ports || []).entries()) {
      if (p.hostPort) bad(`${at}.ports[${j}].hostPort`, "not allowed by the restricted Pod Security Standard");
    }
    if (list !== "containers") continue;

    // An image with a tag (or digest), never :latest.
    const image = String(c.image || "");
    const lastPart = image.split("/").pop();
    if (!image.includes("@") && (!lastPart.includes(":") || lastPart.endsWith(":latest"))) {
      bad(at + ".image", JSON.stringify(image) + " needs a tag other than latest (kustomization.yaml's images:)");
    }
    // Guaranteed QoS: requests equal to limits, CPU and memory given.
    const req = (c.resources || {}).requests || {};
    const lim = (c.resources || {}).limits || {};
    for (const r of ["cpu", "memory"]) {
      if (lim[r] === undefined) bad(`${at}.resources.limits.${r}`, "missing: requests must equal limits (Guaranteed QoS)");
    }
    for (const r of new Set([...Object.keys(req), ...Object.keys(lim)])) {
      if (String(req[r]) !== String(lim[r])) {
        bad(`${at}.resources`, `requests.${r} (${req[r]}) must equal limits.${r} (${lim[r]}) (Guaranteed QoS)`);
      }
    }
    // Probes that do not flap on a busy node, and a drain that fits the grace period.
    const grace = durationSeconds(flag(c.args, "grace_period") || "25s");
    const ready = c.readinessProbe, live = c.livenessProbe;
    if (!ready) bad(at + ".readinessProbe", "missing");
    else if ((ready.failureThreshold || 3) < 2) bad(at + ".readinessProbe.failureThreshold", "must be 2 or more: one slow answer on a busy node must not take the pod out");
    if (!live) bad(at + ".livenessProbe", "missing");
    else if ((live.failureThreshold || 3) * (live.periodSeconds || 10) <= grace) {
      bad(at + ".livenessProbe", `failureThreshold x periodSeconds must exceed --grace_period (${grace} s): a drain is not a hang`);
    }
    for (const [name, p] of [["readinessProbe", ready], ["livenessProbe", live], ["startupProbe", c.startupProbe]]) {
      if (p && (p.timeoutSeconds || 1) < 2) bad(`${at}.${name}.timeoutSeconds`, "must be 2 or more: a busy node answers late");
    }
    const preStop = ((c.lifecycle || {}).preStop || {});
    const cmd = (preStop.exec || {}).command || [];
    const sleep = preStop.sleep ? Number(preStop.sleep.seconds)
        : (cmd.length === 2 && /(^|\/)sleep$/.test(cmd[0])) ? Number(cmd[1]) : 0;
    if (!(sleep > 0)) bad(at + ".lifecycle.preStop", "needs a sleep, so that the pod leaves the endpoints before SIGTERM");
    // A round_robin client leaves a pod only when one of its connections closes: the sleep must
    // outlast the connection age (gRPC adds up to 10%), so that every client has left before
    // SIGTERM's GOAWAY races their calls.
    const age = flag(c.args, "max_connection_age");
    if (age && age !== "inf" && sleep > 0 && !(sleep > 1.1 * durationSeconds(age))) {
      bad(at + ".lifecycle.preStop", `the sleep (${sleep} s) must outlast --max_connection_age (${age}, +10%), so that clients leave before SIGTERM`);
    }
    const tgps = pod.terminationGracePeriodSeconds === undefined ? 30 : pod.terminationGracePeriodSeconds;
    if (!(tgps > sleep + grace)) {
      bad("spec.template.spec.terminationGracePeriodSeconds", `${tgps} must exceed the preStop sleep (${sleep} s) plus --grace_period (${grace} s)`);
    }
  }
}

function checkRules(objects, report) {
  const hpaTargets = new Set(objects.filter(({ object }) => object && object.kind === "HorizontalPodAutoscaler")
      .map(({ label, object }) => label + "/" + ((object.metadata || {}).namespace || "") + "/" +
           ((object.spec || {}).scaleTargetRef || {}).kind + "/" + ((object.spec || {}).scaleTargetRef || {}).name));
  for (const { label, object } of objects) {
    if (!object || typeof object !== "object") continue;
    const where = label + ": " + objectName(object);
    const spec = object.spec || {};
    if (object.kind === "Deployment") {
      const key = label + "/" + ((object.metadata || {}).namespace || "") + "/Deployment/" + (object.metadata || {}).name;
      if (hpaTargets.has(key) && spec.replicas !== undefined) {
        report(where + ": spec.replicas: must be left out: a HorizontalPodAutoscaler owns the count");
      }
      checkPod(where, (spec.template || {}).spec, report);
    } else if (object.kind === "PodDisruptionBudget") {
      if (spec.minAvailable !== undefined || spec.maxUnavailable === undefined) {
        report(where + ": spec: use maxUnavailable, not minAvailable: it holds at any replica count");
      }
    } else if (object.kind === "Namespace") {
      const labels = (object.metadata || {}).labels || {};
      if (labels["pod-security.kubernetes.io/enforce"] !== "restricted") {
        report(where + ": metadata.labels: pod-security.kubernetes.io/enforce must be restricted");
      }
    }
  }
}

function main(argv) {
  if (argv.length === 0 || argv.includes("-h") || argv.includes("--help")) {
    process.stderr.write("usage: validate.js FILE.yaml...\n");
    return 2;
  }
  const objects = [];
  let failures = 0;
  const report = (line) => { failures++; process.stdout.write("FAIL " + line + "\n"); };
  for (const file of argv) {
    const label = path.basename(file).replace(/\.ya?ml$/, "");
    const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
    for (const doc of docs) {
      if (doc.errors.length) {
        report(label + ": YAML: " + doc.errors[0].message);
        continue;
      }
      const object = doc.toJS();
      if (object !== null) objects.push({ label, object });
    }
  }
  checkSchemas(objects, report);
  checkRules(objects, report);
  const labels = [...new Set(objects.map((o) => o.label))];
  process.stdout.write(`validate.js: ${objects.length} objects of ${labels.join(", ")}: ` +
                       (failures ? `${failures} problem(s)` : "every field known to Kubernetes 1.30, gradserve's rules hold") + "\n");
  return failures ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
