package chain

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The record kvnet writes is the bytes encoding/json writes for it: every
// member set or empty, strings it escapes (HTML, JavaScript separators,
// quotes, control characters) and one that is not UTF-8.
func TestChangesEncodeAsEncodingJSON(t *testing.T) {
	for _, changes := range [][]Change{
		{{Mutator: "networks"}},
		{{Mutator: "networks", Rule: "storage", Networks: []string{"a", "b"}}, {Mutator: "vdpa", Networks: []string{"dp"}}},
		{{Mutator: "mac-pool", LeftTo: "kubemacpool", Networks: []string{"n"}}, {Mutator: "mac-pool", MissedBy: "kubemacpool-mutator", Networks: []string{"m"}}, {Mutator: "mac-pool", AskedOf: "kubemacpool", Networks: []string{"o"}}},
		{{Mutator: "x<y>&z", Rule: "quote \" back \\ tab \t nl \n", Networks: []string{"\u2028\u2029", "é", "\x01"}, LeftTo: "\xff", MissedBy: "ok", AskedOf: "\u2028"}},
		{{Mutator: "empty networks", Networks: []string{}}},
	} {
		want, err := json.Marshal(changes)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendChanges([]byte("prefix"), changes)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Errorf("appendChanges\n got %s\nwant prefix%s", got, want)
		}
	}
}
