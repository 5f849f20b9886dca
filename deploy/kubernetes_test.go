package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// manifests is every object of deploy/kubernetes, decoded strictly into
// the Kubernetes API types: an unknown or misspelt field, a wrong type or
// a duplicate key fails, as the API server's strict field validation
// would refuse it.
type manifests struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	pdbs        map[string]*policyv1.PodDisruptionBudget
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret // secrets.example.yaml
}

// kinds maps apiVersion/kind to the type it decodes into.
var kinds = map[string]func() any{
	"apps/v1/Deployment":            func() any { return &appsv1.Deployment{} },
	"v1/Service":                    func() any { return &corev1.Service{} },
	"v1/ConfigMap":                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                     func() any { return &corev1.Secret{} },
	"policy/v1/PodDisruptionBudget": func() any { return &policyv1.PodDisruptionBudget{} },
}

// kustomization is the part of kustomization.yaml kubectl -k reads here.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

func loadManifests(t *testing.T) (manifests, kustomization) {
	t.Helper()
	m := manifests{deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	var k kustomization
	raw, err := os.ReadFile("kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	files, _ := filepath.Glob("kubernetes/*.yaml")
	for _, f := range files {
		base := filepath.Base(f)
		if base == "kustomization.yaml" {
			continue
		}
		if base != "secrets.example.yaml" && !slices.Contains(k.Resources, base) {
			t.Errorf("%s is not in kustomization.yaml's resources", base)
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s #%d: %v", base, i, err)
			}
			newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
			if !ok {
				t.Fatalf("%s #%d: %s %s: not a kind this test knows", base, i, tm.APIVersion, tm.Kind)
			}
			obj := newObj()
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s #%d (%s): %v", base, i, tm.Kind, err)
			}
			var name string
			switch o := obj.(type) {
			case *appsv1.Deployment:
				name, m.deployments[o.Name] = o.Name, o
			case *corev1.Service:
				name, m.services[o.Name] = o.Name, o
			case *policyv1.PodDisruptionBudget:
				name, m.pdbs[o.Name] = o.Name, o
			case *corev1.ConfigMap:
				name, m.configMaps[o.Name] = o.Name, o
			case *corev1.Secret:
				if base != "secrets.example.yaml" {
					t.Errorf("%s: secret %s: secrets belong in secrets.example.yaml, not in applied manifests", base, o.Name)
				}
				name, m.secrets[o.Name] = o.Name, o
			}
			for _, e := range validation.IsDNS1123Subdomain(name) {
				t.Errorf("%s: %s name %q: %s", base, tm.Kind, name, e)
			}
		}
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join("kubernetes", r)); err != nil {
			t.Errorf("kustomization.yaml: resource %s: %v", r, err)
		}
	}
	return m, k
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// The manifests decode strictly into the Kubernetes API types and hold
// together: selectors select the pods' labels, probes and Services name
// ports the containers open on the address presenced listens on, the
// grace covers the preStop pause and the drain, every PRESENCE_ variable
// names a flag of the container's command, every secret mounted is in
// secrets.example.yaml with the key the mount reads.
func TestKubernetesManifests(t *testing.T) {
	m, k := loadManifests(t)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" || k.Namespace == "" {
		t.Errorf("kustomization.yaml: %s %s namespace %q", k.APIVersion, k.Kind, k.Namespace)
	}
	flags := presencedFlags(t)

	node, agg := m.deployments["presence-node"], m.deployments["presence-aggregator"]
	if node == nil || agg == nil {
		t.Fatalf("deployments %v: want presence-node and presence-aggregator", slices.Sorted(mapKeys(m.deployments)))
	}
	if agg.Spec.Replicas == nil || *agg.Spec.Replicas != 2 {
		t.Errorf("presence-aggregator: %v replicas, want 2 (one leads, one stands by)", agg.Spec.Replicas)
	}
	if node.Spec.Replicas == nil || *node.Spec.Replicas < 2 {
		t.Errorf("presence-node: %v replicas, want at least 2: a drained node's clients need another", node.Spec.Replicas)
	}
	for _, d := range []*appsv1.Deployment{node, agg} {
		c := checkDeployment(t, m, d, flags)
		if k.Images[0].Name != c.Image {
			t.Errorf("%s: image %q is not the kustomization's %q", d.Name, c.Image, k.Images[0].Name)
		}
		checkServedBy(t, m, d)
		checkPDB(t, m, d)
	}

	// The node's stop: preStop pause, then the drain, inside the grace.
	c := node.Spec.Template.Spec.Containers[0]
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("presence-node: no preStop sleep: the load balancers would still send clients to a draining node")
	}
	pause := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	drain, err := time.ParseDuration(env(t, m, c, "PRESENCE_DRAIN_TIMEOUT"))
	if err != nil {
		t.Fatalf("presence-node: PRESENCE_DRAIN_TIMEOUT: %v", err)
	}
	grace := time.Duration(*node.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	if grace < pause+drain+5*time.Second {
		t.Errorf("presence-node: terminationGracePeriodSeconds %v < preStop %v + drain %v + 5s: SIGKILL could cut the drain", grace, pause, drain)
	}
	if node.Spec.Strategy.RollingUpdate == nil || node.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("presence-node: a rolling update must not drain a node before its replacement is ready (maxUnavailable 0)")
	}
	// The node authenticates clients and NATS from the secrets.
	if env(t, m, c, "PRESENCE_JWT_SECRET_FILE") == "" || env(t, m, c, "PRESENCE_NATS_CREDS") == "" {
		t.Errorf("presence-node: PRESENCE_JWT_SECRET_FILE and PRESENCE_NATS_CREDS must be set")
	}
	if env(t, m, agg.Spec.Template.Spec.Containers[0], "PRESENCE_NATS_CREDS") == "" {
		t.Errorf("presence-aggregator: PRESENCE_NATS_CREDS must be set")
	}
	if env(t, m, c, "PRESENCE_INSECURE_DEV") != "" || env(t, m, c, "PRESENCE_DEMO") != "" {
		t.Errorf("presence-node: no development flags in production manifests")
	}
}

// checkDeployment checks what every Deployment here must hold and
// returns its container.
func checkDeployment(t *testing.T, m manifests, d *appsv1.Deployment, flags map[string]map[string]bool) corev1.Container {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("%s: selector %v: %v", d.Name, d.Spec.Selector, err)
	}
	pod := d.Spec.Template
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("%s: selector %s does not match the pod labels %v", d.Name, sel, pod.Labels)
	}
	for k, v := range pod.Labels {
		for _, e := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			t.Errorf("%s: label %s=%s: %s", d.Name, k, v, e)
		}
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", d.Name, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) == 0 || flags[c.Args[0]] == nil {
		t.Fatalf("%s: args %v: want presenced node or aggregator", d.Name, c.Args)
	}
	cmdFlags := flags[c.Args[0]]
	for _, name := range envNames(t, m, c) {
		flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, "PRESENCE_"), "_", "-"))
		if !strings.HasPrefix(name, "PRESENCE_") || !cmdFlags[flag] {
			t.Errorf("%s: %s names no flag of presenced %s", d.Name, name, c.Args[0])
		}
	}
	// Readiness on /healthz, on the port presenced listens on.
	listen := env(t, m, c, "PRESENCE_LISTEN")
	port := containerPort(t, d.Name, c, intstr.FromString("http"))
	if !strings.HasSuffix(listen, fmt.Sprintf(":%d", port)) {
		t.Errorf("%s: PRESENCE_LISTEN %q is not the http port %d", d.Name, listen, port)
	}
	rp := c.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/healthz" {
		t.Fatalf("%s: readiness probe %+v, want GET /healthz", d.Name, rp)
	}
	if containerPort(t, d.Name, c, rp.HTTPGet.Port) != port {
		t.Errorf("%s: readiness probe on port %v, presenced listens on %d", d.Name, rp.HTTPGet.Port, port)
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path == "/healthz" {
		t.Errorf("%s: liveness on /healthz restarts every pod during a NATS or Redis outage", d.Name)
	}
	if pod.Spec.TerminationGracePeriodSeconds == nil {
		t.Errorf("%s: no terminationGracePeriodSeconds", d.Name)
	}
	// The image runs as the distroless nonroot user.
	psc, csc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
		csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Errorf("%s: want runAsNonRoot, a read-only root filesystem and no privilege escalation", d.Name)
	}
	checkSecretMounts(t, m, d, c)
	return c
}

// checkSecretMounts: every file an env var points at is in a mounted
// volume, and every secret volume names a secret of
// secrets.example.yaml and keys it has.
func checkSecretMounts(t *testing.T, m manifests, d *appsv1.Deployment, c corev1.Container) {
	t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	files := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			t.Errorf("%s: mount %s names no volume", d.Name, vm.Name)
			continue
		}
		if v.Secret == nil {
			continue
		}
		s := m.secrets[v.Secret.SecretName]
		if s == nil {
			t.Errorf("%s: volume %s: secret %s is not in secrets.example.yaml", d.Name, v.Name, v.Secret.SecretName)
			continue
		}
		for _, it := range v.Secret.Items {
			if _, ok := s.StringData[it.Key]; !ok {
				t.Errorf("%s: secret %s has no key %s", d.Name, s.Name, it.Key)
			}
			files[filepath.Join(vm.MountPath, it.Path)] = true
		}
	}
	for _, name := range envNames(t, m, c) {
		if strings.HasSuffix(name, "_FILE") || name == "PRESENCE_NATS_CREDS" {
			if p := env(t, m, c, name); !files[p] {
				t.Errorf("%s: %s=%s is no file of a mounted secret (%v)", d.Name, name, p, files)
			}
		}
	}
}

// checkServedBy: a Service selects the Deployment's pods, on a port the
// container opens.
func checkServedBy(t *testing.T, m manifests, d *appsv1.Deployment) {
	t.Helper()
	for _, s := range m.services {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		for _, p := range s.Spec.Ports {
			containerPort(t, s.Name, d.Spec.Template.Spec.Containers[0], p.TargetPort)
		}
		return
	}
	t.Errorf("%s: no Service selects its pods", d.Name)
}

// checkPDB: a PodDisruptionBudget selects the Deployment's pods and lets
// at least one be evicted, but never all.
func checkPDB(t *testing.T, m manifests, d *appsv1.Deployment) {
	t.Helper()
	for _, p := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		replicas := int(*d.Spec.Replicas)
		var allowed int // disruptions allowed with every replica up
		switch {
		case p.Spec.MaxUnavailable != nil && p.Spec.MinAvailable == nil:
			allowed, err = intstr.GetScaledValueFromIntOrPercent(p.Spec.MaxUnavailable, replicas, true)
		case p.Spec.MinAvailable != nil && p.Spec.MaxUnavailable == nil:
			var min int
			min, err = intstr.GetScaledValueFromIntOrPercent(p.Spec.MinAvailable, replicas, true)
			allowed = replicas - min
		default:
			t.Errorf("%s: set exactly one of minAvailable and maxUnavailable", p.Name)
			return
		}
		if err != nil || allowed < 1 || allowed >= replicas {
			t.Errorf("%s: allows %d of %d replicas down (%v): want at least 1, never all", p.Name, allowed, replicas, err)
		}
		return
	}
	t.Errorf("%s: no PodDisruptionBudget selects its pods", d.Name)
}

// containerPort resolves a port by number or name among c's ports.
func containerPort(t *testing.T, who string, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort
		}
	}
	t.Fatalf("%s: port %s is not a port of container %s", who, p.String(), c.Name)
	return 0
}

// envNames lists the container's environment: env and every key of its
// envFrom ConfigMaps, which must exist.
func envNames(t *testing.T, m manifests, c corev1.Container) []string {
	t.Helper()
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			t.Fatalf("container %s: envFrom %+v: only ConfigMaps here (secrets are mounted files)", c.Name, ef)
		}
		cm := m.configMaps[ef.ConfigMapRef.Name]
		if cm == nil {
			t.Fatalf("container %s: envFrom names no ConfigMap %s", c.Name, ef.ConfigMapRef.Name)
		}
		for k := range cm.Data {
			names = append(names, k)
		}
	}
	return names
}

// env returns the value of name in c's environment ("" when unset); env
// wins over envFrom, as in Kubernetes.
func env(t *testing.T, m manifests, c corev1.Container, name string) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	for _, ef := range c.EnvFrom {
		if cm := m.configMaps[ef.ConfigMapRef.Name]; cm != nil {
			if v, ok := cm.Data[name]; ok {
				return v
			}
		}
	}
	return ""
}

// presencedFlags builds presenced from the repository and reads its
// commands' flags from their -h.
func presencedFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "presenced")
	build := exec.Command("go", "build", "-o", bin, "./cmd/presenced")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build presenced: %v\n%s", err, out)
	}
	flags := map[string]map[string]bool{}
	for _, cmd := range []string{"node", "aggregator"} {
		out, _ := exec.Command(bin, cmd, "-h").CombinedOutput()
		flags[cmd] = map[string]bool{}
		for _, line := range bytes.Split(out, []byte("\n")) {
			if f := strings.Fields(string(line)); len(f) > 0 && bytes.HasPrefix(line, []byte("  -")) {
				flags[cmd][strings.TrimLeft(f[0], "-")] = true
			}
		}
		if !flags[cmd]["nats"] || !flags[cmd]["listen"] {
			t.Fatalf("cannot read presenced %s -h:\n%s", cmd, out)
		}
	}
	return flags
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
