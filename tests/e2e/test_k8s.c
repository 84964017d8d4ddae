/* Tests of deploy/k8s, offline: tests/k8s/check.mjs checks every manifest
 * against the Kubernetes API's schemas (npm's kubernetes-models) strictly,
 * unknown fields included, and against the project's rules (native gRPC
 * probes, no privilege, Secrets never inlined, nodes known by their service
 * account tokens, every flag one the program has). The manifests pass; a
 * broken copy of one, for each kind of fault, is refused naming the fault. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation"

/* node tests/k8s/check.mjs FILES, with this tree's programs to check
 * flags against; its exit status, output in out. */
static int check(const char *files, char *out, size_t len) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s' && FSDP_BIN='%s/bin' node tests/k8s/check.mjs %s", tu_root(),
           tu_root(), files);
  return tu_sh(cmd, out, len);
}

Test(k8s, the_manifests_pass_the_schemas_and_the_rules) {
  char out[1 << 14];
  int rc = check("deploy/k8s/*.yaml deploy/k8s/Dockerfile", out, sizeof out);
  cr_assert_eq(rc, 0, "deploy/k8s: exit %d:\n%s", rc, out);
  cr_assert(strstr(out, "ok: 12 documents"), "%s", out);
}

/* The manifests deploy/k8s holds, each a file name. */
static const char *const all[] = {"coordinator.yaml", "fsdpd.yaml", "submit-job.yaml",
                                  "networkpolicy.yaml"};
#define NALL (sizeof all / sizeof all[0])
/* 1: check the image's Dockerfile too (it runs make -n and readelf: slower) */
static int with_image;

/* A copy of deploy/k8s/NAME with `from` replaced by `to` (the first one, or
 * every one with every; to appended when from is NULL), checked with the
 * other manifests; its exit status, the output in out. */
static int check_copy(const char *name, const char *from, const char *to, int every, char *out,
                      size_t len) {
  char src[1024];
  snprintf(src, sizeof src, "%s/deploy/k8s/%s", tu_root(), name);
  char *text = tu_slurp(src, NULL);
  cr_assert(!from || strstr(text, from), "%s has no \"%s\"", name, from);
  for (int done = 0; !done;) {
    char *p = from ? strstr(text, from) : NULL;
    size_t n = strlen(text) + strlen(to) + 2;
    char *edited = malloc(n);
    if (p)
      snprintf(edited, n, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
    else
      snprintf(edited, n, "%s%s", text, to);
    free(text);
    text = edited;
    done = !from || !every || !strstr(text, from) || strstr(to, from);
  }
  const int image = !strcmp(name, "Dockerfile");
  char *path = tu_path(image ? "Dockerfile" : "broken.yaml");
  tu_write_file(path, text, strlen(text));
  char files[4096];
  size_t at = (size_t)snprintf(files, sizeof files, "'%s'", path);
  for (size_t i = 0; i < NALL; i++)
    if (strcmp(all[i], name)) at += (size_t)snprintf(files + at, sizeof files - at, " deploy/k8s/%s", all[i]);
  if (with_image && !image) snprintf(files + at, sizeof files - at, " deploy/k8s/Dockerfile");
  int rc = check(files, out, len);
  free(text), free(path);
  return rc;
}

/* Such a copy (the first `from`) is refused, the output naming want. */
static void refused(const char *name, const char *from, const char *to, const char *want) {
  char out[1 << 14];
  int rc = check_copy(name, from, to, 0, out, sizeof out);
  cr_assert_eq(rc, 1, "a copy with \"%s\" -> \"%s\" passed:\n%s", from ? from : "", to, out);
  cr_assert(strstr(out, want), "the refusal does not name \"%s\":\n%s", want, out);
}

Test(k8s, a_wrong_type_is_refused) {
  refused("coordinator.yaml", "replicas: 1", "replicas: one", "/spec/replicas");
  refused("fsdpd.yaml", "containerPort: 7071", "containerPort: \"seven\"", "containerPort");
}

Test(k8s, an_unknown_field_is_refused) {
  refused("fsdpd.yaml", "livenessProbe:", "livenessProbee:", "unknown field \"livenessProbee\"");
  refused("coordinator.yaml", "serviceName:", "servicename:", "unknown field \"servicename\"");
}

Test(k8s, the_projects_rules_are_kept) {
  refused("fsdpd.yaml", "allowPrivilegeEscalation: false", "privileged: true", "privileged");
  refused("coordinator.yaml", "livenessProbe:\n            grpc: {port: 7079}",
          "livenessProbe:\n            tcpSocket: {port: 7079}", "native gRPC");
  /* a TLS port probed by the kubelet's grpc probe, which speaks no TLS */
  refused("coordinator.yaml", "grpc: {port: 7079}\n            periodSeconds: 5",
          "grpc: {port: 7070}\n            periodSeconds: 5", "--health-listen");
  refused("coordinator.yaml", "startupProbe:\n            grpc: {port: 7079}",
          "startupProbe:\n            grpc: {port: 7070}", "--health-listen");
  refused("submit-job.yaml", NULL,
          "---\napiVersion: v1\nkind: Secret\nmetadata: {name: fsdp-tokens}\n"
          "stringData: {user.token: hunter2}\n", "a Secret is inlined");
  refused("submit-job.yaml", "- {name: FSDP_TOKEN_FILE, value: /etc/fsdpd/tokens/user.token}",
          "- {name: FSDP_TOKEN, value: hunter2}", "literal value");
  refused("coordinator.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false",
          "readOnlyRootFilesystem");
  /* a node that held the user token could submit as a user; one that held
   * a token every node holds could act as any */
  refused("fsdpd.yaml", "{key: user.token.sha256, path: user.token.sha256}",
          "{key: user.token, path: user.token}", "a node holds no user, operator or shared node token");
  refused("fsdpd.yaml", "{key: user.token.sha256, path: user.token.sha256}",
          "{key: node.token, path: node.token}", "shared node token");
  refused("fsdpd.yaml", "            defaultMode: 0400\n            items: [{key: user.token",
          "            defaultMode: 0400\n            x: [{key: user.token", "shared node token");
}

/* The kubelet writes a Secret's files as root:root with their mode, and only
 * fsGroup makes a 0400 file readable by a pod's non-root user: the Job's
 * fsdpctl could not read its CA or token without it (every run failed). The
 * mode is read as the cluster reads it, YAML 1.1: 0400 is octal. */
Test(k8s, a_non_root_pod_reads_its_secrets_through_fs_group) {
  refused("submit-job.yaml", "        fsGroup: 65532\n", "", "Secret fsdp-tls ca.crt is written root:root, mode 0400");
  refused("coordinator.yaml", "        fsGroup: 65532\n", "", "Secret fsdp-operator-token * is written root:root");
  /* without the group, a file others may read (the JWKS, 0444) is read all the same */
  char out[1 << 14];
  int rc = check_copy("coordinator.yaml", "        fsGroup: 65532\n", "", 0, out, sizeof out);
  cr_assert_eq(rc, 1, "%s", out);
  cr_assert(strstr(out, "Secret fsdp-tls * is written root:root, mode 0400"), "%s", out);
  cr_assert(!strstr(out, "ConfigMap fsdp-node-jwks"), "%s", out);
}

/* One coordinator, one database: a StatefulSet of exactly one replica,
 * governed by a headless Service. */
Test(k8s, the_coordinator_is_one_replica_under_a_headless_service) {
  refused("coordinator.yaml", "replicas: 1", "replicas: 2", "must have exactly 1");
  refused("coordinator.yaml", "  clusterIP: None\n", "", "is not headless");
  refused("coordinator.yaml", "serviceName: fsdp-coordinator-pods", "serviceName: fsdp-coordinator",
          "is not headless");
  refused("coordinator.yaml", "serviceName: fsdp-coordinator-pods", "serviceName: fsdp-coord",
          "no such Service");
  refused("coordinator.yaml", "kind: StatefulSet", "kind: Deployment", "make it a StatefulSet");
}

/* fsGroup alone makes the kubelet walk every file of fsdp-data at each pod
 * start; the image has no entry point, so each container names its program. */
Test(k8s, volumes_are_not_walked_and_programs_are_named) {
  refused("fsdpd.yaml", "        fsGroupChangePolicy: OnRootMismatch\n", "", "fsGroupChangePolicy");
  refused("coordinator.yaml", "        fsGroupChangePolicy: OnRootMismatch\n", "", "fsGroupChangePolicy");
  refused("submit-job.yaml", "command: [fsdpctl]", "workingDir: /", "no command");
}

/* deploy/k8s/Dockerfile cannot be built here (no network); what it takes
 * from the tree is checked: each COPY a path make install writes, the CUDA
 * libraries in the plugin's RUNPATH, the plugin beside the programs, every
 * program a manifest runs on the image's PATH, and (the programs built) a
 * package for every library they link. */
Test(k8s, the_image_holds_what_the_manifests_run, .timeout = 120) {
  with_image = 1;
  refused("Dockerfile", "COPY usr/local/lib/fsdpd/ /usr/local/lib/fsdpd/",
          "COPY usr/local/lib/fsdp/ /usr/local/lib/fsdpd/", "COPY usr/local/lib/fsdp/: make install");
  refused("Dockerfile", "COPY usr/local/lib/fsdpd/ /usr/local/lib/fsdpd/",
          "COPY usr/local/lib/fsdpd/ /usr/lib/fsdpd/", "../lib/fsdpd beside the programs");
  refused("Dockerfile", "COPY usr/local/cuda/lib64/ /usr/local/cuda/lib64/",
          "COPY usr/local/cuda/lib64/ /usr/lib/", "its RUNPATH /usr/local/cuda/lib64");
  refused("Dockerfile", "COPY usr/local/bin/ /usr/local/bin/", "COPY usr/local/bin/ /opt/fsdpd/bin/",
          "runs fsdpd, which");
  refused("fsdpd.yaml", "command: [fsdpd]", "command: [fsdpd-gpu]", "runs fsdpd-gpu, which");
  /* fsdpd (built for this test) links libuv */
  refused("Dockerfile", " libuv1 ", " ", "links libuv.so.1, from the package libuv1");
  with_image = 0;
}

/* A node's identity is its projected service account token: for the
 * coordinator's audience (never the API server's), of the account the
 * coordinator expects; and every flag a manifest passes is one its program
 * has. */
Test(k8s, the_nodes_identity_and_every_flag_agree_with_the_programs) {
  refused("fsdpd.yaml", "{audience: fsdp-coordinator, expirationSeconds", "{expirationSeconds",
          "without an audience is the API server's");
  refused("fsdpd.yaml", "{audience: fsdp-coordinator,", "{audience: vault,",
          "which no coordinator here takes");
  refused("fsdpd.yaml", "serviceAccountName: fsdpd", "serviceAccountName: builder",
          "service account builder");
  refused("coordinator.yaml", "--node-jwt-subject=system:serviceaccount:$(POD_NAMESPACE):fsdpd",
          "--node-jwt-subject=system:serviceaccount:$(POD_NAMESPACE):default",
          "which no coordinator here takes");
  refused("coordinator.yaml", "--node-jwks-file=", "--node-jwks-fille=",
          "fsdp-coordinator has no option --node-jwks-fille");
  refused("fsdpd.yaml", "--rank-host=", "--rankhost=", "fsdpd has no option --rankhost");
}
