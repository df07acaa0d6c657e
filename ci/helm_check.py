#!/usr/bin/env python3
"""Check the Helm chart as rendered (`helm template`, read from stdin) against what the engine
accepts and what a cluster needs, without a cluster:

- one Deployment per role (api, worker, jobs), each running `serve --roles <role>`;
- each Deployment's environment, resolved as the kubelet would (the ConfigMap and Secret
  rendered beside it, the pod IP from the downward API, `$(VAR)` references), passes
  `seckill serve --check-config` for its role, with nothing else in the environment;
- the admin listener binds the pod's address (not loopback), the probes reach it on /healthz
  and /readyz, and the ports named in the probes and Service are the ones the settings bind;
- every file a setting names (TLS CA and client certificate, JWKS) lies under a volume mounted
  in that container; files of a Secret made outside the chart (`tls.secret`) are stood in for by
  PEM files here, so that `--check-config` reads a file where the pod would;
- the Service, the HPA and the PodDisruptionBudget select the api pods; the NetworkPolicy lets
  only listed peers reach the admin port; the migration Job runs `migrate` with DATABASE_URL
  (and the files it names mounted);
- every pod runs with no API token mounted, the Deployments' pods as the chart's ServiceAccount;
  each role's pods spread over zones and nodes by constraints that select that role's pods;
- the optional parts, each rendered with --optional and absent without: the Ingress sends every
  path to the api Service's public port; the ServiceMonitor scrapes /metrics on the admin port
  through a Service over every role's pods; the PrometheusRule holds exactly the groups of
  deploy/prometheus/alerts.yml and the dashboard ConfigMap exactly deploy/grafana/seckill.json.

    helm template ... | ci/helm_check.py path/to/seckill [--optional]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

POD_IP = "10.244.3.7"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OPTIONAL = ["Ingress", "ServiceMonitor", "PrometheusRule"]


def fail(msg):
    print(f"helm_check: {msg}", file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def main():
    seckill = sys.argv[1]
    optional = "--optional" in sys.argv[2:]
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    configmaps = {c["metadata"]["name"]: c.get("data", {}) for c in by_kind.get("ConfigMap", [])}
    secrets = {s["metadata"]["name"]: s.get("stringData", {}) for s in by_kind.get("Secret", [])}

    deployments = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
                   for d in by_kind.get("Deployment", [])}
    expect(sorted(deployments) == ["api", "jobs", "worker"],
           f"one Deployment per role expected, found {sorted(deployments)}")

    for role, dep in deployments.items():
        name = dep["metadata"]["name"]
        pod = dep["spec"]["template"]
        expect(dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
               f"{name}: the selector does not match its pods")
        (c,) = pod["spec"]["containers"]
        expect(c["args"] == ["serve", "--roles", role], f"{name}: runs {c['args']}, not role {role}")
        env = resolve_env(name, c, configmaps, secrets)
        env = mount_files(name, pod, c, env, secrets)
        out = subprocess.run([seckill, *c["args"], "--check-config"], env=env,
                             capture_output=True, text=True)
        expect(out.returncode == 0,
               f"{name}: serve --check-config refused its settings:\n{out.stdout}{out.stderr}")
        expect(f"roles {role}" in out.stdout and "stores real" in out.stdout,
               f"{name}: --check-config says\n{out.stdout}")

        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        host, port = env["SECKILL_ADMIN_LISTEN"].rsplit(":", 1)
        expect(host == POD_IP, f"{name}: the admin listener binds {host}, not the pod's address")
        expect(int(port) == ports["admin"], f"{name}: admin port {port} is not the container's")
        expect(int(env["SECKILL_LISTEN"].rsplit(":", 1)[1]) == ports["http"],
               f"{name}: SECKILL_LISTEN is not the container's http port")
        for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                            ("startupProbe", "/healthz")]:
            get = c[probe]["httpGet"]
            expect(get["path"] == path and get["port"] == "admin",
                   f"{name}: {probe} is {get}, expected {path} on the admin port")
        sc = c["securityContext"]
        expect(sc.get("readOnlyRootFilesystem") and not sc.get("allowPrivilegeEscalation"),
               f"{name}: the container must run read-only without privilege escalation")
        expect(pod["spec"]["securityContext"].get("runAsNonRoot"), f"{name}: must run as non-root")

    api = deployments["api"]
    api_labels = api["spec"]["template"]["metadata"]["labels"]
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in by_kind["Service"]}
    svc = services["api"]
    selects = lambda sel, d: sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    for role, d in deployments.items():
        expect(selects(svc["spec"]["selector"], d) == (role == "api"),
               "the Service must select the api pods and no other")
    expect([p["targetPort"] for p in svc["spec"]["ports"]] == ["http"], "the Service must target http")
    (hpa,) = by_kind["HorizontalPodAutoscaler"]
    expect(hpa["spec"]["scaleTargetRef"]["name"] == api["metadata"]["name"], "the HPA must scale api")
    expect("replicas" not in api["spec"], "with the HPA on, the api Deployment must leave replicas to it")
    (pdb,) = by_kind["PodDisruptionBudget"]
    expect(pdb["spec"]["selector"]["matchLabels"].items() <= api_labels.items(), "the PDB must select api")

    (np,) = by_kind["NetworkPolicy"]
    admin_rules = [r for r in np["spec"]["ingress"] if any(p["port"] == "admin" for p in r["ports"])]
    expect(len(admin_rules) == 1 and admin_rules[0].get("from"),
           "the NetworkPolicy must admit the admin port only from listed peers")
    for rule in np["spec"]["ingress"]:
        expect(rule.get("from") or all(p["port"] == "http" for p in rule["ports"]),
               f"an ingress rule open to all admits more than the public port: {rule}")

    (job,) = by_kind["Job"]
    (jc,) = job["spec"]["template"]["spec"]["containers"]
    expect(jc["args"] == ["migrate"], f"the migration Job runs {jc['args']}")
    expect("pre-install" in job["metadata"]["annotations"]["helm.sh/hook"], "migrations must run before install")
    ref = next(e["valueFrom"]["secretKeyRef"] for e in jc["env"] if e["name"] == "DATABASE_URL")
    mount_files("the migration Job", job["spec"]["template"], jc,
                {"DATABASE_URL": secrets[ref["name"]]["DATABASE_URL"]}, secrets)
    hook_secret = next(s for s in by_kind["Secret"] if s["metadata"]["name"] == ref["name"])
    expect("helm.sh/hook" in hook_secret["metadata"].get("annotations", {}),
           "the migration Job's Secret must exist before the hook runs (a hook itself)")
    expect(job["spec"]["template"]["spec"].get("automountServiceAccountToken") is False,
           "the migration Job must not mount an API token")

    (sa,) = by_kind["ServiceAccount"]
    expect(sa.get("automountServiceAccountToken") is False, "the ServiceAccount must not mount its token")
    for role, d in deployments.items():
        spec = d["spec"]["template"]["spec"]
        expect(spec.get("serviceAccountName") == sa["metadata"]["name"],
               f"{role}: runs as {spec.get('serviceAccountName')}, not the chart's ServiceAccount")
        expect(spec.get("automountServiceAccountToken") is False, f"{role}: must not mount an API token")
        spread = spec.get("topologySpreadConstraints", [])
        expect({c["topologyKey"] for c in spread} >= {"topology.kubernetes.io/zone", "kubernetes.io/hostname"},
               f"{role}: its pods must spread over zones and nodes")
        for c in spread:
            sel = c["labelSelector"]["matchLabels"]
            expect(all(selects(sel, o) == (r == role) for r, o in deployments.items()),
                   f"{role}: a spread constraint selects {sel}, not this role's pods alone")

    for kind in OPTIONAL:
        expect(bool(by_kind.get(kind)) == optional,
               f"{kind}: {'missing' if optional else 'rendered'} with the optional parts {'on' if optional else 'off'}")
    dashboards = [c for c in by_kind["ConfigMap"] if "seckill.json" in c.get("data", {})]
    expect(bool(dashboards) == optional, "the dashboard ConfigMap must come with the optional parts alone")
    if optional:
        check_optional(by_kind, deployments, services, svc, dashboards, selects)
    print(f"helm_check: ok ({len(docs)} objects; roles {', '.join(sorted(deployments))}; "
          f"optional parts {'on' if optional else 'off'})")


def check_optional(by_kind, deployments, services, api_svc, dashboards, selects):
    (ing,) = by_kind["Ingress"]
    for rule in ing["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            expect(backend["name"] == api_svc["metadata"]["name"] and backend["port"] == {"name": "http"},
                   f"the Ingress sends {rule['host']}{path['path']} to {backend}, not the api Service's http port")
    (sm,) = by_kind["ServiceMonitor"]
    metrics = [s for s in services.values()
               if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    expect(len(metrics) == 1, f"the ServiceMonitor selects {len(metrics)} Services, expected one")
    (m,) = metrics
    expect(all(selects(m["spec"]["selector"], d) for d in deployments.values()),
           "the metrics Service must select the pods of every role")
    ports = {p["name"]: p for p in m["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        expect(ep["path"] == "/metrics" and ports.get(ep["port"], {}).get("targetPort") == "admin",
               f"the ServiceMonitor scrapes {ep}, not /metrics on the admin port")
    (rule,) = by_kind["PrometheusRule"]
    with open(os.path.join(ROOT, "deploy/prometheus/alerts.yml")) as f:
        expect(rule["spec"] == yaml.safe_load(f),
               "the PrometheusRule is not deploy/prometheus/alerts.yml (the rules promtool tests)")
    (dash,) = dashboards
    expect(dash["metadata"]["labels"].get("grafana_dashboard") == "1",
           "the dashboard ConfigMap lacks the label Grafana's sidecar looks for")
    with open(os.path.join(ROOT, "deploy/grafana/seckill.json")) as f:
        expect(json.loads(dash["data"]["seckill.json"]) == json.load(f),
               "the dashboard ConfigMap is not deploy/grafana/seckill.json")


STANDIN_PEM = "-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n"
FILE_PATH = re.compile(r"/etc/seckill/[A-Za-z0-9._/-]+")


def mount_files(name, pod, c, env, secrets):
    """Every /etc/seckill/... path the settings name must lie under one of the container's
    volume mounts, from a volume of the pod. The files are made here (a rendered Secret's
    contents, or a stand-in PEM for a Secret made outside the chart) and the settings rewritten
    to point at them."""
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    here = tempfile.mkdtemp(prefix="helm-check-")
    out = dict(env)
    for var, value in env.items():
        for path in FILE_PATH.findall(value):
            mount = next((m for m in mounts if path.startswith(m + "/")), None)
            expect(mount is not None, f"{name}: {var} names {path}, which no volume mount holds")
            vol = volumes.get(mounts[mount])
            expect(vol is not None and "secret" in vol,
                   f"{name}: the mount {mount} has no Secret volume in the pod")
            rel = path[len(mount) + 1:]
            secret = vol["secret"]["secretName"]
            items = {i["path"]: i["key"] for i in vol["secret"].get("items", [])}
            if secret in secrets:
                key = items.get(rel, rel)
                expect(key in secrets[secret], f"{name}: {var} names {path}, not in Secret {secret}")
                content = secrets[secret][key]
            else:
                content = STANDIN_PEM
            local = os.path.join(here, mounts[mount], rel)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "w") as f:
                f.write(content)
            out[var] = out[var].replace(path, local)
    return out


def resolve_env(name, c, configmaps, secrets):
    """The container's environment as the kubelet builds it (envFrom first, then env in order)."""
    env = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(configmaps[src["configMapRef"]["name"]])
        elif "secretRef" in src:
            env.update(secrets[src["secretRef"]["name"]])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                    lambda m: env.get(m.group(1), m.group(0)), e["value"])
            continue
        vf = e["valueFrom"]
        if "fieldRef" in vf:
            expect(vf["fieldRef"]["fieldPath"] == "status.podIP", f"{name}: unexpected fieldRef {vf}")
            env[e["name"]] = POD_IP
        elif "secretKeyRef" in vf:
            ref = vf["secretKeyRef"]
            expect(ref["name"] in secrets and ref["key"] in secrets[ref["name"]],
                   f"{name}: {e['name']} refers to {ref}, which the chart does not render")
            env[e["name"]] = secrets[ref["name"]][ref["key"]]
        elif "configMapKeyRef" in vf:
            ref = vf["configMapKeyRef"]
            env[e["name"]] = configmaps[ref["name"]][ref["key"]]
        else:
            fail(f"{name}: cannot resolve {e}")
    return {k: str(v) for k, v in env.items()}


if __name__ == "__main__":
    main()
