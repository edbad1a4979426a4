package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/benchmark"
	"github.com/kvnet/kvnet/webhook"
)

// stackCPU holds each BenchmarkJSONStacks sub-benchmark's CPU ns/op, for
// the ratios of those that follow it in the same run.
var stackCPU = map[string]float64{}

// measure runs f as sub-benchmark name and records its CPU ns/op.
func measure(b *testing.B, name string, f func() error) {
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := benchmark.CPUTime()
		for b.Loop() {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
		cpu := float64((benchmark.CPUTime() - cpu0).Nanoseconds()) / float64(b.N)
		b.ReportMetric(cpu, "cpu-ns/op")
		stackCPU[name] = cpu
	})
}

// ratio reports num/den of two recorded sub-benchmarks as sub-benchmark
// name's unit.
func ratio(b *testing.B, name, num, den, unit string) {
	if n, d := stackCPU[num], stackCPU[den]; n > 0 && d > 0 {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
			}
			b.ReportMetric(n/d, unit)
		})
	}
}

// BenchmarkJSONStacks sets kvnet's JSON decoding beside the one it stands
// in for, in one run, on the bodies of the README's table: the VM gaining
// four networks (two by rule, two by annotation) and the real API server's
// launcher-pod review (11 KB). The review and the handler's view are
// decoded in one pass (scanned by tokens; the pod's view by
// encoding/json/v2 within it); the alternative is the API
// server's decoder (sigs.k8s.io/json) reading the review, then the view
// (x-apiserver: v2's CPU over the API server decoder's). Then the whole VM
// request through the Edge beside the floor (x-floor-cpu), and what that
// ratio would be with the API server's decoder (kvnet's CPU per request
// plus the difference measured here). The encoder is encoding/json: the
// answer was once encoded with segmentio/encoding, whose gain the HTTPS
// table did not need (docs/architecture.md, "JSON in and out").
//
// The API server's decoder is also the fallback for what v2 refuses; that
// costs nothing here: it runs only on input no API server sends.
func BenchmarkJSONStacks(b *testing.B) {
	hs := exampleHandlers(b)
	vm := reviewBytes(b, toJSON(b, benchVM), admissionv1.Create, nil)
	pod, err := os.ReadFile("../test/loadtest/testdata/launcher-pod-review.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, body := range []struct {
		name string
		raw  []byte
		h    admission.Handler
	}{{"vm", vm, hs[webhook.PathMutateVM]}, {"launcher-pod", pod, hs[webhook.PathMutateLauncherPods]}} {
		measure(b, "decode/"+body.name+"/kvnet", func() error { return webhook.DecodeReview(body.raw, webhook.NewView(body.h)) })
		measure(b, "decode/"+body.name+"/apiserver", func() error { return webhook.DecodeReviewV1(body.raw, webhook.NewView(body.h)) })
		ratio(b, "decode/"+body.name+"/ratio", "decode/"+body.name+"/kvnet", "decode/"+body.name+"/apiserver", "x-apiserver")
	}

	// The VM's answer, as the Edge encodes it.
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(vm, &ar); err != nil {
		b.Fatal(err)
	}
	resp := hs[webhook.PathMutateVM].Handle(context.Background(), admission.Request{AdmissionRequest: *ar.Request})
	if !resp.Allowed || len(resp.Patches) == 0 {
		b.Fatalf("the VM was not patched: %v", resp.Result)
	}
	measure(b, "encode/vm/encoding-json", func() error { _, err := webhook.EncodeAnswer(resp, json.Marshal); return err })

	floor := &admission.Webhook{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})}
	post := func(h http.Handler) func() error {
		return func() error {
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(vm))
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				b.Fatalf("status %d", w.Code)
			}
			return nil
		}
	}
	measure(b, "request/vm/floor", post(floor))
	measure(b, "request/vm/kvnet", post(webhook.Webhook(hs[webhook.PathMutateVM])))
	f, k := stackCPU["request/vm/floor"], stackCPU["request/vm/kvnet"]
	if f == 0 || k == 0 {
		return
	}
	b.Run("x-floor-cpu", func(b *testing.B) {
		for b.Loop() {
		}
		b.ReportMetric(f/k, "kvnet")
		b.ReportMetric(f/(k+stackCPU["decode/vm/apiserver"]-stackCPU["decode/vm/kvnet"]), "apiserver-decode")
	})
}
