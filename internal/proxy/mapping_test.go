package proxy

import (
	"encoding/json"
	"maps"
	"reflect"
	"testing"

	"gomodules.xyz/jsonpatch/v2"

	"github.com/kvnet/kvnet/internal/proxy/store"
)

func TestRewrite(t *testing.T) {
	remote := Remote{MigrationID: "m1", Target: "10.0.0.9", Ports: map[string]int{"40001": 0, "40002": 49152}}
	good := store.Mapping{MigrationID: "m1", Address: "192.168.7.2", Target: "10.0.0.9", Ports: map[string]string{"40001": "31001", "40002": "31002"}}
	with := func(f func(*store.Mapping)) string {
		m := good
		m.Ports = maps.Clone(good.Ports)
		f(&m)
		return m.Encode()
	}
	tests := map[string]struct {
		annotation string
		wantAddr   string
		wantPorts  map[string]int
	}{
		"no annotation: hold back":     {annotation: ""},
		"garbage: hold back":           {annotation: "{not json"},
		"matching: proxy, values kept": {annotation: good.Encode(), wantAddr: "192.168.7.2", wantPorts: map[string]int{"31001": 0, "31002": 49152}},
		"other migration":              {annotation: with(func(m *store.Mapping) { m.MigrationID = "m0" })},
		"other target":                 {annotation: with(func(m *store.Mapping) { m.Target = "10.0.0.8" })},
		"missing port":                 {annotation: with(func(m *store.Mapping) { delete(m.Ports, "40002") })},
		"extra port":                   {annotation: with(func(m *store.Mapping) { m.Ports["40003"] = "31003" })},
		"duplicate local port":         {annotation: with(func(m *store.Mapping) { m.Ports["40002"] = "31001" })},
		"no address":                   {annotation: with(func(m *store.Mapping) { m.Address = "" })},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			addr, ports := Rewrite(remote, tc.annotation)
			if addr != tc.wantAddr || !maps.Equal(ports, tc.wantPorts) || (tc.wantPorts == nil) != (ports == nil) {
				t.Errorf("Rewrite = %q, %v; want %q, %v", addr, ports, tc.wantAddr, tc.wantPorts)
			}
			// Deterministic: the same inputs give the same output.
			addr2, ports2 := Rewrite(remote, tc.annotation)
			if addr2 != addr || !maps.Equal(ports2, ports) {
				t.Errorf("second call differs: %q, %v", addr2, ports2)
			}
		})
	}
}

func TestStatusOps(t *testing.T) {
	const base = "/status/migrationState/"
	proxyPorts := map[string]int{"31001": 0, "31002": 49152}
	tests := map[string]struct {
		raw     string
		address string
		ports   map[string]int
		want    []jsonpatch.JsonPatchOperation
	}{
		"remote values, no mapping: both removed": {
			raw: `{"status":{"migrationState":{"targetNodeAddress":"10.0.0.9","targetDirectMigrationNodePorts":{"40001":0},"targetState":{}}}}`,
			want: []jsonpatch.JsonPatchOperation{
				jsonpatch.NewOperation("remove", base+"targetNodeAddress", nil),
				jsonpatch.NewOperation("remove", base+"targetDirectMigrationNodePorts", nil),
			},
		},
		"empty but present ports map is removed too": {
			raw:  `{"status":{"migrationState":{"targetDirectMigrationNodePorts":{},"targetState":{}}}}`,
			want: []jsonpatch.JsonPatchOperation{jsonpatch.NewOperation("remove", base+"targetDirectMigrationNodePorts", nil)},
		},
		"already empty: no ops": {raw: `{"status":{"migrationState":{"targetState":{}}}}`},
		"remote values, mapping: both replaced": {
			raw:     `{"status":{"migrationState":{"targetNodeAddress":"10.0.0.9","targetDirectMigrationNodePorts":{"40001":0,"40002":49152}}}}`,
			address: "192.168.7.2", ports: proxyPorts,
			want: []jsonpatch.JsonPatchOperation{
				jsonpatch.NewOperation("add", base+"targetNodeAddress", "192.168.7.2"),
				jsonpatch.NewOperation("add", base+"targetDirectMigrationNodePorts", proxyPorts),
			},
		},
		"already the proxy's: no ops (the no-op write)": {
			raw:     `{"status":{"migrationState":{"targetNodeAddress":"192.168.7.2","targetDirectMigrationNodePorts":{"31002":49152,"31001":0}}}}`,
			address: "192.168.7.2", ports: proxyPorts,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v, err := decodeStatusView([]byte(tc.raw))
			if err != nil {
				t.Fatal(err)
			}
			ops := v.Status.MigrationState.ops(tc.address, tc.ports)
			// Compare as JSON: operation values are any.
			got, _ := json.Marshal(ops)
			want, _ := json.Marshal(tc.want)
			var g, w any
			_ = json.Unmarshal(got, &g)
			_ = json.Unmarshal(want, &w)
			if !reflect.DeepEqual(g, w) {
				t.Errorf("ops = %s, want %s", got, want)
			}
		})
	}
	if _, err := decodeStatusView([]byte(`{"status":`)); err == nil {
		t.Error("a truncated object must be an error")
	}
}
