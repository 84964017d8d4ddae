// check.mjs: deploy/k8s checked offline against the Kubernetes API's schemas,
// strictly, plus the project's own rules. Run by tests/e2e/test_k8s.c.
//
//   node tests/k8s/check.mjs FILE.yaml...
//
// Schemas: npm's kubernetes-models (its validators are compiled from the
// Kubernetes OpenAPI schemas). They check types, enums and required fields,
// but, like the API server's non-strict decoding, ignore unknown fields. So
// each field is also probed: its value replaced by one no schema type
// accepts, a known field makes the validator complain at its path and an
// unknown one (a misspelling such as livenessProbee) does not.
//
// The project's rules: every container of a long-running workload
// (Deployment, StatefulSet, DaemonSet) has native gRPC liveness and readiness
// probes; no container is privileged or may escalate, each runs as non-root
// with a read-only root file system and no capability; no Secret is inlined
// (no Secret objects here, no literal env value for a token, key or password);
// a DaemonSet (every node) holds no user, operator or shared node token; a
// projected service account token has an audience, and the one fsdpd sends
// is for an audience and of an account a coordinator here checks
// (--node-jwt-audience, --node-jwt-subject); a pod that runs as a user
// other than root reads the files the kubelet writes (Secrets, ConfigMaps)
// through fsGroup when their mode keeps them from others (0400). With
// FSDP_BIN set (a bin/ of this tree), every --flag a container passes must
// be in its program's --help.
//
// YAML is read as kubectl and Helm read it, YAML 1.1 (sigs.k8s.io/yaml over
// go-yaml): `defaultMode: 0400` is octal, 256, where YAML 1.2 would make it
// decimal 400 (0620), so the rules see the modes the cluster sets.
//
// A Dockerfile among the files (deploy/k8s/Dockerfile, which cannot be built
// here) is checked against this tree: each COPY takes a path `make install`
// writes (or, for the CUDA libraries, lands in the plugin's RUNPATH), every
// program a manifest runs is installed on the image's PATH, and with FSDP_BIN
// every library the built programs and plugin link (readelf -d) comes from a
// Debian package it installs.
//
// Exit 0 with "ok: N documents" on stdout, else 1 with one line per finding.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const findings = [];
let documents = 0;
// nodes' identities (projected service account tokens fsdpd sends) and the
// coordinators that check them, matched once every document is read
const identities = [];
const checkers = [];
// the programs containers run, the coordinators' workloads, the Services
const programs = [];
const coordinators = [];
const services = {};
// with FSDP_BIN (this tree's bin/): every --flag a container passes must be
// one its program's --help lists
const bin = process.env.FSDP_BIN;
const helpOf = {};

// apps/v1 StatefulSet -> IoK8sApiAppsV1StatefulSet; v1 Service -> IoK8sApiCoreV1Service;
// networking.k8s.io/v1 NetworkPolicy -> IoK8sApiNetworkingV1NetworkPolicy
function schemaName(apiVersion, kind) {
  let [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["core", apiVersion];
  const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);
  if (group.endsWith(".k8s.io")) group = group.slice(0, -".k8s.io".length);
  if (group.includes(".")) return null; // only the built-in groups are known here
  return `IoK8sApi${cap(group)}${cap(version)}${kind}`;
}

const pointer = (path) => path.map((k) => "/" + String(k).replace(/~/g, "~0").replace(/\//g, "~1")).join("");

function errorsOf(validate, doc) {
  validate(doc);
  return validate.errors || [];
}

// Every object key under obj, by path, probed one at a time.
function unknownFields(validate, doc, obj, path, where) {
  if (Array.isArray(obj)) {
    obj.forEach((v, i) => unknownFields(validate, doc, v, [...path, i], where));
    return;
  }
  if (!obj || typeof obj !== "object") return;
  for (const key of Object.keys(obj)) {
    const p = [...path, key];
    const saved = obj[key];
    obj[key] = Symbol("probe");
    const at = pointer(p);
    const known = errorsOf(validate, doc).some((e) => e.instancePath === at || e.instancePath.startsWith(at + "/"));
    obj[key] = saved;
    if (!known) findings.push(`${where}: ${at}: unknown field "${key}" (not in the ${doc.kind} schema)`);
    else unknownFields(validate, doc, saved, p, where);
  }
}

const octal = (m) => "0" + m.toString(8);

// The files the kubelet writes for volume v (Secret, ConfigMap, projected
// sources): {what, mode} each, the mode an item's, else the volume's
// defaultMode, else the API's default 0644. A projected service account
// token is left out: the kubelet gives it to the pod's runAsUser itself.
function kubeletFiles(v) {
  const files = [];
  const add = (what, src, defaultMode) => {
    const items = src.items?.length ? src.items : [{ key: "*" }];
    for (const i of items) files.push({ what: `${what} ${i.key}`, mode: i.mode ?? defaultMode ?? 0o644 });
  };
  if (v.secret) add(`Secret ${v.secret.secretName}`, v.secret, v.secret.defaultMode);
  if (v.configMap) add(`ConfigMap ${v.configMap.name}`, v.configMap, v.configMap.defaultMode);
  for (const src of v.projected?.sources || []) {
    if (src.secret) add(`Secret ${src.secret.name}`, src.secret, v.projected.defaultMode);
    if (src.configMap) add(`ConfigMap ${src.configMap.name}`, src.configMap, v.projected.defaultMode);
  }
  return files;
}

function podSpecOf(doc) {
  if (["Deployment", "StatefulSet", "DaemonSet", "Job"].includes(doc.kind)) return doc.spec?.template?.spec;
  if (doc.kind === "Pod") return doc.spec;
  return null;
}

function projectRules(doc, where) {
  if (doc.kind === "Secret")
    findings.push(`${where}: a Secret is inlined; create it out of band (kubectl create secret) and reference it`);
  const pod = podSpecOf(doc);
  if (!pod) return;
  const longRunning = ["Deployment", "StatefulSet", "DaemonSet"].includes(doc.kind);
  // a DaemonSet runs on every node: a node holds the node token and, to
  // check users, the user token's digest, never a token that acts as a user
  if (doc.kind === "DaemonSet")
    for (const v of pod.volumes || []) {
      if (!v.secret) continue;
      const keys = (v.secret.items || []).map((i) => i.key);
      if (!v.secret.items || keys.some((k) => /^(user|operator|node)\.token$/.test(k)))
        findings.push(`${where}: volume ${v.name}: a node holds no user, operator or shared node token: list the Secret's items (user.token.sha256, the digest fsdpd checks users with; a node's identity is its service account token)`);
    }
  // a projected service account token is for one audience, never the API
  // server's (one without an audience would let its holder call the API)
  const projected = {};
  for (const v of pod.volumes || [])
    for (const src of v.projected?.sources || [])
      if (src.serviceAccountToken) {
        if (!src.serviceAccountToken.audience)
          findings.push(`${where}: volume ${v.name}: a projected service account token without an audience is the API server's; give the coordinator's (fsdp-coordinator)`);
        projected[v.name] = src.serviceAccountToken;
      }
  if (pod.securityContext?.runAsNonRoot !== true)
    findings.push(`${where}: spec.template.spec.securityContext.runAsNonRoot must be true`);
  // the kubelet writes a Secret's files as root:root with their mode; with
  // fsGroup they are root:fsGroup and group-readable. Without it a pod not
  // run as root cannot read a file whose mode keeps others out (0400).
  const psc = pod.securityContext || {};
  if (psc.fsGroup === undefined && psc.runAsUser !== 0)
    for (const v of pod.volumes || [])
      for (const f of kubeletFiles(v))
        if (!(f.mode & 0o004))
          findings.push(`${where}: volume ${v.name}: ${f.what} is written root:root, mode ${octal(f.mode)}, which user ${psc.runAsUser ?? "(non-root)"} cannot read: set spec.template.spec.securityContext.fsGroup (and runAsGroup) to its group, as the other pods do`);
  // fsGroup without OnRootMismatch: the kubelet walks every file of every
  // volume at each start, fsdp-data's terabytes included
  if (psc.fsGroup !== undefined && psc.fsGroupChangePolicy !== "OnRootMismatch" &&
      (pod.volumes || []).some((v) => v.persistentVolumeClaim))
    findings.push(`${where}: fsGroup without fsGroupChangePolicy: OnRootMismatch makes the kubelet change the ownership of every file of its volumes at each start`);
  for (const c of [...(pod.initContainers || []), ...(pod.containers || [])]) {
    const w = `${where}: container ${c.name}`;
    const sc = c.securityContext || {};
    if (sc.privileged) findings.push(`${w}: privileged`);
    if (sc.allowPrivilegeEscalation !== false) findings.push(`${w}: allowPrivilegeEscalation must be false`);
    if (sc.readOnlyRootFilesystem !== true) findings.push(`${w}: readOnlyRootFilesystem must be true`);
    if (!(sc.capabilities?.drop || []).includes("ALL")) findings.push(`${w}: capabilities must drop ALL`);
    if (longRunning && !(c.livenessProbe?.grpc && c.readinessProbe?.grpc))
      findings.push(`${w}: needs native gRPC liveness and readiness probes (livenessProbe.grpc, readinessProbe.grpc)`);
    // the kubelet's grpc: probe speaks no TLS: with --tls-cert the probes go
    // to the plaintext --health-listen port
    // the image has no entry point: command names the program, args its options
    const args = [...(c.command || []), ...(c.args || [])];
    if (!c.command?.length) findings.push(`${w}: no command: the image has no ENTRYPOINT; name the program in command (args for its options)`);
    const prog = args.length ? args[0].split("/").pop() : "";
    if (prog) programs.push({ where: w, prog });
    if (prog === "fsdp-coordinator") coordinators.push({ where, doc, pod });
    if (args.some((a) => a.startsWith("--tls-cert"))) {
      const h = args.find((a) => a.startsWith("--health-listen="));
      const port = h ? Number(h.split(":").pop()) : NaN;
      for (const p of [c.startupProbe, c.livenessProbe, c.readinessProbe])
        if (p?.grpc && p.grpc.port !== port)
          findings.push(`${w}: serves TLS (--tls-cert), which the kubelet's grpc probe cannot speak: probe the plaintext --health-listen port (${h || "none given"})`);
    }
    for (const e of c.env || [])
      if (/TOKEN|PASSWORD|SECRET|KEY/i.test(e.name) && !/_(FILE|PATH|DIR)$/i.test(e.name) &&
          e.value !== undefined)
        findings.push(`${w}: env ${e.name} holds a literal value; take it from a Secret (valueFrom.secretKeyRef)`);
    const flag = (name) => args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
    // the token fsdpd sends: a projected service account token?
    const tokenFile = flag("token-file");
    for (const m of c.volumeMounts || [])
      if (tokenFile && projected[m.name] && tokenFile.startsWith(m.mountPath + "/"))
        identities.push({ where: w, audience: projected[m.name].audience, account: pod.serviceAccountName || "default" });
    if (flag("node-jwks-file"))
      checkers.push({ where: w, audience: flag("node-jwt-audience") || "fsdp-coordinator", subject: flag("node-jwt-subject") || "" });
    if (bin && prog && c.command?.length) {
      try {
        helpOf[prog] ??= execFileSync(`${bin}/${prog}`, ["--help"], { encoding: "utf8" });
      } catch (e) {
        helpOf[prog] = (e.stdout || "") + (e.stderr || "");
      }
      for (const a of args.slice(1)) {
        const m = /^(--[a-z0-9-]+)/.exec(a);
        if (m && !new RegExp(`${m[1]}(?![a-z0-9-])`).test(helpOf[prog]))
          findings.push(`${w}: ${prog} has no option ${m[1]} (${prog} --help)`);
      }
    }
  }
}

// One coordinator: its state is one SQLite database, so it is a StatefulSet
// of one replica (two would split the state), governed by a headless
// Service (a ClusterIP one gives its pods no DNS names).
function coordinatorRules() {
  for (const { where, doc } of coordinators) {
    if (doc.kind !== "StatefulSet") {
      findings.push(`${where}: fsdp-coordinator runs in a ${doc.kind}: make it a StatefulSet of one replica (its database on a volume of its own)`);
      continue;
    }
    if ((doc.spec.replicas ?? 1) !== 1)
      findings.push(`${where}: replicas ${doc.spec.replicas}: fsdp-coordinator must have exactly 1 (one database; a second replica would be a second, diverging state)`);
    const svc = services[doc.spec.serviceName];
    if (!svc)
      findings.push(`${where}: serviceName ${doc.spec.serviceName}: no such Service here (the StatefulSet's governing, headless Service)`);
    else if (svc.spec?.clusterIP !== "None")
      findings.push(`${where}: serviceName ${doc.spec.serviceName} is not headless (clusterIP: None): a StatefulSet's governing Service gives its pods their DNS names`);
  }
}

// ---- the image ----
const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const dockerfiles = [];
const DEFAULT_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];
const STAGE = "/fsdp-image-stage";

// Its instructions, continuation lines joined: [{op, args: text}].
function dockerInstructions(text) {
  const out = [];
  for (const line of text.replace(/\\\n/g, " ").split("\n")) {
    const m = /^\s*([A-Za-z]+)\s+(.*)$/.exec(line);
    if (m && !line.trim().startsWith("#")) out.push({ op: m[1].toUpperCase(), args: m[2].trim() });
  }
  return out;
}

function dockerRules(file, text) {
  const ins = dockerInstructions(text);
  // what `make install` writes, with the plugin as where nvcc is
  const plan = execFileSync("make", ["-s", "-n", "-C", root, "install", `DESTDIR=${STAGE}`,
                                     "PREFIX=/usr/local", "NVCC=/bin/true"], { encoding: "utf8" });
  const staged = [...plan.matchAll(new RegExp(`${STAGE}(/[^\\s;&|>]*)`, "g"))].map((m) => m[1].replace(/\/+$/, ""));
  const installed = new Set();
  for (const m of plan.matchAll(/install -m 0755 ([^\n]*) \S+\/usr\/local\/bin\/?\n/g))
    for (const w of m[1].split(/\s+/)) installed.add(basename(w));
  const rpath = /-rpath,(\S+)/.exec(readFileSync(join(root, "Makefile"), "utf8"))?.[1];
  const copied = [];
  for (const { op, args } of ins.filter((i) => i.op === "COPY" || i.op === "ADD")) {
    const words = args.split(/\s+/).filter((w) => !w.startsWith("--"));
    if (/--from/.test(args)) continue;
    const dest = words.pop().replace(/\/+$/, "");
    for (const src of words) {
      const path = "/" + src.replace(/^\/+|\/+$/g, "");
      copied.push({ src: path, dest });
      if (path.startsWith("/usr/local/cuda/")) {
        if (dest !== rpath)
          findings.push(`${file}: ${op} ${src}: the CUDA libraries go where the plugin looks for them, its RUNPATH ${rpath} (Makefile), not ${dest}`);
      } else if (!staged.some((p) => p === path || p.startsWith(path + "/")))
        findings.push(`${file}: ${op} ${src}: make install (DESTDIR, PREFIX=/usr/local) writes nothing there`);
    }
  }
  const env = ins.filter((i) => i.op === "ENV").map((i) => /^PATH[= ](\S+)/.exec(i.args)?.[1]).filter(Boolean).pop();
  const path = env ? env.split(":") : DEFAULT_PATH;
  const onPath = copied.some((c) => c.src === "/usr/local/bin" && path.includes(c.dest));
  for (const { where, prog } of programs)
    if (!installed.has(prog) || !onPath)
      findings.push(`${where}: runs ${prog}, which ${file} does not put on the image's PATH (make install's /usr/local/bin, copied to a PATH directory)`);
  if (!copied.some((c) => c.src === "/usr/local/lib/fsdpd" && c.dest === "/usr/local/lib/fsdpd"))
    findings.push(`${file}: the CUDA plugin is looked for in ../lib/fsdpd beside the programs: COPY usr/local/lib/fsdpd/ /usr/local/lib/fsdpd/`);
  if (!bin) return;
  // every library the built programs and plugin link: from a package installed here
  const pkgs = new Set(ins.filter((i) => i.op === "RUN").flatMap((i) =>
    [...i.args.matchAll(/apt-get install ([^&|;]*)/g)].flatMap((m) => m[1].split(/\s+/).filter((w) => w && !w.startsWith("-")))));
  const essential = new Set(["libc6"]);
  const where = {};
  for (const line of execFileSync("ldconfig", ["-p"], { encoding: "utf8" }).split("\n")) {
    const m = /^\s*(\S+) \((libc6,x86-64)[^)]*\) => (\S+)/.exec(line);
    if (m) where[m[1]] ??= m[3];
  }
  const objects = [...installed].map((p) => join(bin, p)).concat(join(bin, "..", "lib", "fsdpd", "libfsdp-cuda.so"));
  for (const obj of objects.filter((o) => existsSync(o))) {
    const needed = [...execFileSync("readelf", ["-d", obj], { encoding: "utf8" }).matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
    for (const lib of needed) {
      const at = where[lib];
      // the CUDA libraries: copied into the image by its recipe, which names them
      if ((at && at.startsWith("/usr/local/cuda")) || (obj.endsWith(".so") && text.includes(lib))) continue;
      // dpkg knows a file by the path its package ships (/lib or /usr/lib, merged here)
      let pkg = "";
      const real = at ? execFileSync("readlink", ["-f", at], { encoding: "utf8" }).trim() : "";
      for (const p of at ? [at, real, real.replace(/^\/usr/, ""), at.replace(/^\/usr/, "")] : []) {
        try {
          pkg ||= execFileSync("dpkg", ["-S", p], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).split(":")[0];
        } catch { /* not by this path */ }
      }
      if (!pkg) findings.push(`${file}: ${basename(obj)} links ${lib}, which no Debian package here provides: copy it into the image`);
      else if (!pkgs.has(pkg) && !essential.has(pkg))
        findings.push(`${file}: ${basename(obj)} links ${lib}, from the package ${pkg}, which the image does not install (apt-get install)`);
    }
  }
}

// every node identity is one a coordinator takes: its audience, its account
function identityRules() {
  for (const id of identities) {
    const ok = checkers.some((k) => k.audience === id.audience && k.subject.endsWith(`:${id.account}`));
    if (!ok)
      findings.push(`${id.where}: sends the token of service account ${id.account} for audience ${id.audience}, which no coordinator here takes (--node-jwt-audience, --node-jwt-subject=system:serviceaccount:NAMESPACE:${id.account})`);
  }
}

for (const file of process.argv.slice(2)) {
  if (/(^|\/)Dockerfile[^/]*$/.test(file)) {
    dockerfiles.push(file);
    continue;
  }
  let docs;
  try {
    docs = parseAllDocuments(readFileSync(file, "utf8"), { version: "1.1" });
  } catch (e) {
    findings.push(`${file}: ${e.message}`);
    continue;
  }
  for (const d of docs) {
    if (d.errors.length) {
      findings.push(`${file}: YAML: ${d.errors[0].message}`);
      continue;
    }
    const doc = d.toJS();
    if (!doc) continue;
    documents++;
    const where = `${file}: ${doc.kind}/${doc.metadata?.name}`;
    const name = doc.apiVersion && doc.kind ? schemaName(doc.apiVersion, doc.kind) : null;
    let validate;
    try {
      ({ validate } = await import(`kubernetes-models/_schemas/${name}`));
    } catch {
      findings.push(`${where}: no schema for apiVersion ${doc.apiVersion} kind ${doc.kind}`);
      continue;
    }
    for (const e of errorsOf(validate, doc))
      findings.push(`${where}: ${e.instancePath || "/"}: ${e.message || e.keyword + " " + JSON.stringify(e.params)}`);
    unknownFields(validate, doc, doc, [], where);
    if (doc.kind === "Service") services[doc.metadata?.name] = doc;
    projectRules(doc, where);
  }
}
identityRules();
coordinatorRules();
for (const file of dockerfiles) {
  try {
    dockerRules(file, readFileSync(file, "utf8"));
  } catch (e) {
    findings.push(`${file}: ${e.message}`);
  }
}
if (findings.length) {
  for (const f of findings) console.log(f);
  process.exit(1);
}
console.log(`ok: ${documents} documents`);
