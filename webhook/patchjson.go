package webhook

import (
	"slices"
	"strconv"

	"gomodules.xyz/jsonpatch/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/apijson"
)

// appendOps appends ops as encoding/json writes them ([]patchOp), for the
// values a VM or VMI mutation makes: strings, booleans, string maps (and
// the maps Nested builds around them), and the networks, interfaces and
// memory kvnet writes, in the shapes the scan reads whole (see scan.go).
// It reports false for any other value, and the caller then encodes the
// whole patch by reflection: a field these appenders do not know is never
// dropped, only encoded the slow way.
//
// Why by hand: over HTTPS at one connection the handler runs cold between
// requests, and encoding the patch by reflection (segmentio/encoding's
// codecs walking KubeVirt's types) was its largest single step there, a
// sixth of the handler. TestHandEncodedTypesHaveTheFieldsWritten fails
// when a KubeVirt type written here gains a field, and
// TestAppendOpsIsEncodingJSONs holds the bytes to encoding/json's.
func appendOps(b []byte, ops []jsonpatch.Operation) ([]byte, bool) {
	b = append(b, '[')
	for i, op := range ops {
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		b = append(b, `{"op":`...)
		if b, ok = appendString(b, op.Operation); !ok {
			return b, false
		}
		b = append(b, `,"path":`...)
		if b, ok = appendString(b, op.Path); !ok {
			return b, false
		}
		if op.Value != nil {
			b = append(b, `,"value":`...)
			if b, ok = appendValue(b, op.Value); !ok {
				return b, false
			}
		}
		b = append(b, '}')
	}
	return append(b, ']'), true
}

func appendString(b []byte, s string) ([]byte, bool) {
	b, err := apijson.AppendString(b, s)
	return b, err == nil
}

func appendValue(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case string:
		return appendString(b, v)
	case bool:
		return strconv.AppendBool(b, v), true
	case *bool:
		return nullable(b, v, func(b []byte, v *bool) ([]byte, bool) { return strconv.AppendBool(b, *v), true })
	case map[string]string:
		return appendMap(b, v, appendString)
	case map[string]any:
		return appendMap(b, v, appendValue)
	case []kubevirtv1.Network:
		return appendList(b, v, appendNetwork)
	case *[]kubevirtv1.Network:
		return nullable(b, v, listOf(appendNetwork))
	case *kubevirtv1.Network:
		return nullable(b, v, appendNetwork)
	case []kubevirtv1.Interface:
		return appendList(b, v, appendInterface)
	case *[]kubevirtv1.Interface:
		return nullable(b, v, listOf(appendInterface))
	case *kubevirtv1.Interface:
		return nullable(b, v, appendInterface)
	case *kubevirtv1.Memory:
		return nullable(b, v, appendMemory)
	}
	return b, false
}

// nullable writes p with write, or null for a nil p, as encoding/json does.
func nullable[T any](b []byte, p *T, write func([]byte, *T) ([]byte, bool)) ([]byte, bool) {
	if p == nil {
		return append(b, "null"...), true
	}
	return write(b, p)
}

// listOf writes a list through a pointer with elem for each element.
func listOf[T any](elem func([]byte, *T) ([]byte, bool)) func([]byte, *[]T) ([]byte, bool) {
	return func(b []byte, list *[]T) ([]byte, bool) { return appendList(b, *list, elem) }
}

// appendMap writes m with its keys sorted, as encoding/json does.
func appendMap[V any](b []byte, m map[string]V, value func([]byte, V) ([]byte, bool)) ([]byte, bool) {
	if m == nil {
		return append(b, "null"...), true
	}
	var room [8]string
	keys := room[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		if b, ok = appendString(b, k); !ok {
			return b, false
		}
		b = append(b, ':')
		if b, ok = value(b, m[k]); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

func appendList[T any](b []byte, list []T, elem func([]byte, *T) ([]byte, bool)) ([]byte, bool) {
	if list == nil {
		return append(b, "null"...), true
	}
	b = append(b, '[')
	for i := range list {
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		if b, ok = elem(b, &list[i]); !ok {
			return b, false
		}
	}
	return append(b, ']'), true
}

// appendNetwork writes a pod or Multus network; a resource claim is left
// to reflection.
func appendNetwork(b []byte, n *kubevirtv1.Network) ([]byte, bool) {
	if n.ResourceClaim != nil {
		return b, false
	}
	b = append(b, `{"name":`...)
	b, ok := appendString(b, n.Name)
	if pod := n.Pod; ok && pod != nil {
		b = append(b, `,"pod":{`...)
		b, ok = appendMembers(b, true, member{"vmNetworkCIDR", pod.VMNetworkCIDR}, member{"vmIPv6NetworkCIDR", pod.VMIPv6NetworkCIDR})
		b = append(b, '}')
	}
	if multus := n.Multus; ok && multus != nil {
		b = append(b, `,"multus":{"networkName":`...)
		b, ok = appendString(b, multus.NetworkName)
		if multus.Default {
			b = append(b, `,"default":true`...)
		}
		b = append(b, '}')
	}
	return append(b, '}'), ok
}

// appendInterface writes an interface of any binding; ports, port ranges
// and DHCP options are left to reflection.
func appendInterface(b []byte, iface *kubevirtv1.Interface) ([]byte, bool) {
	if iface.Ports != nil || iface.PortRanges != nil || iface.DHCPOptions != nil {
		return b, false
	}
	b = append(b, `{"name":`...)
	b, ok := appendString(b, iface.Name)
	if !ok {
		return b, false
	}
	b, ok = appendMembers(b, false, member{"model", iface.Model})
	m := &iface.InterfaceBindingMethod
	for _, binding := range [...]struct {
		set  bool
		name string
	}{
		{m.Bridge != nil, `,"bridge":{}`},
		{m.DeprecatedSlirp != nil, `,"slirp":{}`},
		{m.Masquerade != nil, `,"masquerade":{}`},
		{m.SRIOV != nil, `,"sriov":{}`},
		{m.DeprecatedMacvtap != nil, `,"macvtap":{}`},
		{m.DeprecatedPasst != nil, `,"passt":{}`},
		{m.PasstBinding != nil, `,"passtBinding":{}`},
	} {
		if binding.set {
			b = append(b, binding.name...)
		}
	}
	if iface.Binding != nil && ok {
		b = append(b, `,"binding":{"name":`...)
		b, ok = appendString(b, iface.Binding.Name)
		b = append(b, '}')
	}
	if ok {
		b, ok = appendMembers(b, false, member{"macAddress", iface.MacAddress})
	}
	if iface.BootOrder != nil {
		b = append(b, `,"bootOrder":`...)
		b = strconv.AppendUint(b, uint64(*iface.BootOrder), 10)
	}
	if ok {
		b, ok = appendMembers(b, false, member{"pciAddress", iface.PciAddress}, member{"tag", iface.Tag})
	}
	if iface.ACPIIndex != 0 {
		b = append(b, `,"acpiIndex":`...)
		b = strconv.AppendInt(b, int64(iface.ACPIIndex), 10)
	}
	if ok {
		b, ok = appendMembers(b, false, member{"state", string(iface.State)})
	}
	return append(b, '}'), ok
}

// appendMemory writes the memory kvnet sets (memLock); guest sizes,
// hugepages and an added overhead are left to reflection.
func appendMemory(b []byte, m *kubevirtv1.Memory) ([]byte, bool) {
	if m.Hugepages != nil || m.Guest != nil || m.MaxGuest != nil {
		return b, false
	}
	b = append(b, '{')
	ok := true
	if o := m.ReservedOverhead; o != nil {
		if o.AddedOverhead != nil {
			return b, false
		}
		b = append(b, `"reservedOverhead":{`...)
		if o.MemLock != nil {
			b = append(b, `"memLock":`...)
			b, ok = appendString(b, string(*o.MemLock))
		}
		b = append(b, '}')
	}
	return append(b, '}'), ok
}

// member is a string member written with omitempty.
type member struct{ name, value string }

// appendMembers writes each member that is not empty, after a comma but
// for the object's first (first: the object has no member yet).
func appendMembers(b []byte, first bool, ms ...member) ([]byte, bool) {
	for _, m := range ms {
		if m.value == "" {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		b = append(b, m.name...)
		b = append(b, `":`...)
		var ok bool
		if b, ok = appendString(b, m.value); !ok {
			return b, false
		}
	}
	return b, true
}
