package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// admitAll creates every VM of examples/, file by file, and reports what
// kvnet did to each; it returns how many did not get the outcome they are
// there to show.
//
// changers names the mutating webhooks the diffs show: "kvnet", or with
// KubeVirt running "kvnet and virt-api" (virt-api's mutator defaults every VM
// after kvnet: machine type, firmware UUID, architecture).
func admitAll(ctx context.Context, c client.Client, w *warningCollector, vms []vmDoc, changers string, out io.Writer, say sayFunc) (failures int, err error) {
	lastFile := ""
	for _, vm := range vms {
		if vm.file != lastFile {
			say("\n==> examples/%s", vm.file)
			lastFile = vm.file
		}
		if err := ensureNamespace(ctx, c, vm.obj.GetNamespace()); err != nil {
			return failures, err
		}
		refusal, err := admit(ctx, c, w, vm.obj, changers, out)
		if err != nil {
			return failures, err
		}
		if ok := refusal == nil; ok != vm.wantValid {
			failures++
			fmt.Fprintf(out, "    !! expected %s to be %s\n", key(vm.obj), map[bool]string{true: "admitted", false: "refused"}[vm.wantValid])
		}
	}
	return failures, nil
}

// admit creates one VM and reports what happened to it. It returns the
// refusal, nil when the API server admitted the VM.
func admit(ctx context.Context, c client.Client, w *warningCollector, obj *unstructured.Unstructured, changers string, out io.Writer) (*metav1.Status, error) {
	before := obj.DeepCopy()
	w.reset()
	err := c.Create(ctx, obj)
	fmt.Fprintf(out, "\n--- %s %s: ", obj.GetKind(), key(before))
	var status apierrors.APIStatus
	switch {
	case err == nil:
	case errors.As(err, &status) && (apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err)):
		fmt.Fprintln(out, "REFUSED")
		msg := status.Status().Message
		var causes []metav1.StatusCause
		if d := status.Status().Details; d != nil {
			causes = d.Causes
		}
		if len(causes) == 0 {
			fmt.Fprintf(out, "    %s\n", msg)
		} else {
			// The message repeats the causes; print who refused, then one
			// line per field.
			who, _, _ := strings.Cut(msg, " denied the request")
			fmt.Fprintf(out, "    %s denied the request:\n", who)
			for _, cause := range causes {
				fmt.Fprintf(out, "      - %s: %s\n", cause.Field, cause.Message)
			}
		}
		printWarnings(out, w.list())
		st := status.Status()
		return &st, nil
	default:
		return nil, fmt.Errorf("creating %s: %w", key(before), err)
	}
	var stored unstructured.Unstructured
	stored.SetGroupVersionKind(before.GroupVersionKind())
	if err := c.Get(ctx, client.ObjectKeyFromObject(before), &stored); err != nil {
		return nil, err
	}
	a, b := normalize(before), normalize(&stored)
	d := diffLines(a, b, 2)
	if d == "" {
		fmt.Fprintf(out, "admitted, unchanged by %s\n", changers)
	} else {
		fmt.Fprintf(out, "admitted; %s changed (- as written, + as stored):\n", changers)
		fmt.Fprint(out, indent(d, "    "))
	}
	printWarnings(out, w.list())
	return nil, nil
}

func printWarnings(out io.Writer, ws []string) {
	for _, w := range ws {
		fmt.Fprintf(out, "    warning: %s\n", w)
	}
}

// normalize renders an object as YAML without the fields the API server
// adds to every object, so the diff shows kvnet's changes only.
func normalize(u *unstructured.Unstructured) string {
	o := u.DeepCopy().Object
	for _, f := range []string{"managedFields", "uid", "resourceVersion", "generation", "creationTimestamp"} {
		unstructured.RemoveNestedField(o, "metadata", f)
	}
	delete(o, "status")
	y, _ := yaml.Marshal(o)
	return string(y)
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" {
			b.WriteString(prefix + l)
		}
	}
	return b.String()
}

func key(o client.Object) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// warningCollector keeps the admission warnings of the last request.
type warningCollector struct {
	mu sync.Mutex
	ws []string
}

func (w *warningCollector) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ws = append(w.ws, text)
}

func (w *warningCollector) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ws = nil
}

func (w *warningCollector) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ws...)
}
