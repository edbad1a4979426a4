// Package offline runs kvnet's admission chain on files, without a cluster:
// each VM or VMI goes through the same handlers the webhook serves, as a
// CREATE AdmissionReview, and the returned patch is applied to the input.
package offline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/lookup"
)

// Doc is one object read from a file, as JSON.
type Doc struct {
	Source string // file and document index, for messages
	Kind   string
	Raw    []byte
}

// Result is what admission made of one VM or VMI.
type Result struct {
	Doc      Doc
	Mutated  []byte // JSON; nil when the object was denied at mutation
	Warnings []string
	// Denied holds the message of a refusal (mutating or validating).
	Denied string
	// Related are the objects (JSON) the cluster would create because this
	// one was admitted, such as its IPAMClaims; empty when it was denied.
	Related [][]byte
}

// RelatedFunc returns the objects, as JSON, that kvnet's controllers would
// create for an admitted object of kind in namespace.
type RelatedFunc func(ctx context.Context, kind, namespace string, mutated []byte) ([][]byte, error)

// ReadFiles reads every YAML or JSON document from paths ("-" is stdin);
// directories are read one level deep, in name order.
func ReadFiles(paths []string, stdin io.Reader) ([]Doc, error) {
	var docs []Doc
	for _, p := range paths {
		if p == "-" {
			d, err := readStream("stdin", stdin)
			if err != nil {
				return nil, err
			}
			docs = append(docs, d...)
			continue
		}
		files := []string{p}
		if st, err := os.Stat(p); err != nil {
			return nil, err
		} else if st.IsDir() {
			entries, err := os.ReadDir(p)
			if err != nil {
				return nil, err
			}
			files = files[:0]
			for _, e := range entries {
				ext := filepath.Ext(e.Name())
				if !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
			sort.Strings(files)
		}
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				return nil, err
			}
			d, err := readStream(f, fh)
			fh.Close()
			if err != nil {
				return nil, err
			}
			docs = append(docs, d...)
		}
	}
	return docs, nil
}

func readStream(name string, r io.Reader) ([]Doc, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs []Doc
	for i := 0; ; i++ {
		chunk, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: reading document %d: %w", name, i, err)
		}
		if len(bytes.TrimSpace(chunk)) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSON(chunk)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d is not valid YAML: %w", name, i, err)
		}
		if string(js) == "null" {
			continue
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d is not an object: %w", name, i, err)
		}
		if tm.Kind == "List" {
			var list struct {
				Items []json.RawMessage `json:"items"`
			}
			if err := json.Unmarshal(js, &list); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
			}
			for j, it := range list.Items {
				var itm metav1.TypeMeta
				_ = json.Unmarshal(it, &itm)
				docs = append(docs, Doc{Source: fmt.Sprintf("%s#%d.items[%d]", name, i, j), Kind: itm.Kind, Raw: it})
			}
			continue
		}
		docs = append(docs, Doc{Source: fmt.Sprintf("%s#%d", name, i), Kind: tm.Kind, Raw: js})
	}
}

// Facts builds a cluster snapshot from NADs, Namespaces and a KubeVirt CR
// found among docs; other kinds are ignored.
func Facts(docs []Doc) (*lookup.Snapshot, error) {
	var nads []nadv1.NetworkAttachmentDefinition
	var nss []corev1.Namespace
	var kv *kubevirtv1.KubeVirt
	for _, d := range docs {
		switch d.Kind {
		case "NetworkAttachmentDefinition":
			var n nadv1.NetworkAttachmentDefinition
			if err := json.Unmarshal(d.Raw, &n); err != nil {
				return nil, fmt.Errorf("%s: %w", d.Source, err)
			}
			if n.Namespace == "" {
				n.Namespace = "default"
			}
			nads = append(nads, n)
		case "Namespace":
			var n corev1.Namespace
			if err := json.Unmarshal(d.Raw, &n); err != nil {
				return nil, fmt.Errorf("%s: %w", d.Source, err)
			}
			nss = append(nss, n)
		case "KubeVirt":
			kv = &kubevirtv1.KubeVirt{}
			if err := json.Unmarshal(d.Raw, kv); err != nil {
				return nil, fmt.Errorf("%s: %w", d.Source, err)
			}
		}
	}
	return lookup.NewSnapshot(nads, nss, kv), nil
}

// Admitter runs documents through kvnet's handlers.
type Admitter struct {
	// Kinds are the handlers a document of each kind ("VirtualMachine",
	// "VirtualMachineInstance") goes through; another kind is not admitted.
	Kinds map[string]KindHandlers
	// Related run on every admitted object, so the CLI shows what a
	// controller would create next to the object that causes it.
	Related []RelatedFunc
	// Namespace is used for objects that name none; default "default".
	Namespace string
}

// KindHandlers are the mutating and validating handlers of one kind, and
// the resource the API server names in its requests.
type KindHandlers struct {
	Mutate, Validate admission.Handler
	Resource         string
}

// NewAdmitter runs documents through kinds, the handlers the webhook
// serves (the caller, cmd, builds them on the same chains); related are
// the controllers' previews (see Admitter.Related).
func NewAdmitter(kinds map[string]KindHandlers, related ...RelatedFunc) *Admitter {
	return &Admitter{Kinds: kinds, Related: related, Namespace: "default"}
}

// Admit runs one VM or VMI through mutation and then validation, as the API
// server would on CREATE. Other kinds return ok=false.
func (a *Admitter) Admit(ctx context.Context, d Doc) (res Result, ok bool, err error) {
	hs, ok := a.Kinds[d.Kind]
	if !ok {
		return Result{}, false, nil
	}
	res.Doc = d
	raw := d.Raw
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return res, true, fmt.Errorf("%s: %w", d.Source, err)
	}
	ns := meta.Metadata.Namespace
	if ns == "" {
		ns = a.Namespace
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       types.UID("offline-" + d.Source),
		Kind:      metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: d.Kind},
		Resource:  metav1.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: hs.Resource},
		Name:      meta.Metadata.Name,
		Namespace: ns,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: raw},
	}}
	resp := hs.Mutate.Handle(ctx, req)
	res.Warnings = append(res.Warnings, resp.Warnings...)
	if !resp.Allowed {
		res.Denied = message(resp)
		return res, true, nil
	}
	mutated, err := apply(raw, resp)
	if err != nil {
		return res, true, fmt.Errorf("%s: %w", d.Source, err)
	}
	res.Mutated = mutated
	req.Object.Raw = mutated
	vresp := hs.Validate.Handle(ctx, req)
	res.Warnings = append(res.Warnings, vresp.Warnings...)
	if !vresp.Allowed {
		res.Denied = message(vresp)
		return res, true, nil
	}
	for _, f := range a.Related {
		objs, err := f(ctx, d.Kind, ns, mutated)
		if err != nil {
			return res, true, fmt.Errorf("%s: %w", d.Source, err)
		}
		res.Related = append(res.Related, objs...)
	}
	return res, true, nil
}

// apply applies a response's patch to raw.
func apply(raw []byte, resp admission.Response) ([]byte, error) {
	if len(resp.Patches) == 0 {
		return raw, nil
	}
	pb, err := json.Marshal(resp.Patches)
	if err != nil {
		return nil, err
	}
	p, err := jsonpatch.DecodePatch(pb)
	if err != nil {
		return nil, fmt.Errorf("decoding kvnet's patch: %w", err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		return nil, fmt.Errorf("applying kvnet's patch: %w", err)
	}
	return out, nil
}

// message renders a refusal as kubectl would show it: the summary, then one
// line per field cause.
func message(resp admission.Response) string {
	if resp.Result == nil {
		return "denied"
	}
	var b strings.Builder
	b.WriteString(resp.Result.Message)
	if d := resp.Result.Details; d != nil && len(d.Causes) > 1 {
		for _, c := range d.Causes {
			fmt.Fprintf(&b, "\n  - %s: %s", c.Field, c.Message)
		}
	}
	return b.String()
}

// ToYAML renders a JSON object as YAML.
func ToYAML(js []byte) ([]byte, error) { return yaml.JSONToYAML(js) }
