package proxy

import (
	"strconv"
	"testing"
)

// CheckMigrationPorts accepts what KubeVirt's virt-handler announces and
// nothing a tenant-written status could add: the relay opens a listener,
// and the target dials, per announced port.
func TestCheckMigrationPorts(t *testing.T) {
	many := map[string]int{}
	for i := range 2000 {
		many[strconv.Itoa(30000+i)] = 0
	}
	for name, tc := range map[string]struct {
		ports map[string]int
		ok    bool
	}{
		"migration only":        {map[string]int{"40001": 0}, true},
		"block migration":       {map[string]int{"40001": 0, "40002": 49152, "40003": 49153}, true},
		"none yet":              {nil, true},
		"2000 listeners":        {many, false},
		"four ports":            {map[string]int{"1": 0, "2": 49152, "3": 49153, "4": 0}, false},
		"another libvirt port":  {map[string]int{"40001": 22}, false},
		"two to one port":       {map[string]int{"40001": 0, "40002": 0}, false},
		"key not a port":        {map[string]int{"api": 0}, false},
		"key out of range":      {map[string]int{"70000": 0}, false},
		"port zero as node key": {map[string]int{"0": 0}, false},
	} {
		if err := CheckMigrationPorts(tc.ports); (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok=%v", name, err, tc.ok)
		}
	}
}
