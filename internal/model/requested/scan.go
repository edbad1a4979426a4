package requested

import (
	"bytes"
	"errors"
	"io"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/kvnet/kvnet/internal/config"
)

// scanRequested reads the JSON form token by token, with a switch on each
// member name, as the webhook reads a VM's review: encoding/json/v2's
// struct decoding walked a table of fields by reflection for every member,
// and cost a VM mutation over HTTPS as much as all the mutators' own work
// (its code is large and runs cold between requests). cniArgs, passed on
// as it is, is still decoded by v2.
//
// It accepts a subset of what requestedV1 does, with the same result
// (FuzzRequestedDecodersAgree): names matched exactly, no unknown or
// duplicate name, no null, nothing after the list. What it refuses is left
// to requestedV1, whose errors users see.
func scanRequested(s string) ([]config.Network, bool) {
	sc := scanners.Get().(*scanner)
	defer func() {
		sc.buf.Reset()
		sc.dec.Reset(&sc.buf)
		scanners.Put(sc)
	}()
	sc.buf.WriteString(s)
	sc.dec.Reset(&sc.buf)
	nets, err := sc.list()
	if err != nil {
		return nil, false
	}
	if _, err := sc.dec.ReadToken(); err != io.EOF {
		return nil, false
	}
	return nets, true
}

var errShape = errors.New("not the annotation's shape")

type scanner struct {
	dec jsontext.Decoder
	buf bytes.Buffer
}

var scanners = sync.Pool{New: func() any { return new(scanner) }}

func (s *scanner) list() ([]config.Network, error) {
	if err := s.open('['); err != nil {
		return nil, err
	}
	nets := make([]config.Network, 0, 2)
	for s.dec.PeekKind() == '{' {
		nets = append(nets, config.Network{})
		if err := s.network(&nets[len(nets)-1]); err != nil {
			return nil, err
		}
	}
	return nets, s.close(']')
}

func (s *scanner) network(n *config.Network) error {
	if err := s.open('{'); err != nil {
		return err
	}
	for s.dec.PeekKind() == '"' {
		name, err := s.text()
		if err != nil {
			return err
		}
		switch string(name) {
		case "name":
			err = s.str(&n.Name)
		case "nad":
			var t []byte
			if t, err = s.text(); err == nil {
				err = n.NAD.UnmarshalText(t)
			}
		case "binding":
			err = s.str(&n.Binding)
		case "defaultRoute":
			err = s.bool(&n.DefaultRoute)
		case "persistentIPs":
			err = s.bool(&n.PersistentIPs)
		case "ips":
			err = s.strings(&n.IPs)
		case "mac":
			err = s.str(&n.MAC)
		case "logicalSwitch":
			err = s.str(&n.LogicalSwitch)
		case "cniArgs":
			if s.dec.PeekKind() == 'n' {
				return errShape
			}
			err = jsonv2.UnmarshalDecode(&s.dec, &n.CNIArgs)
		default:
			return errShape
		}
		if err != nil {
			return err
		}
	}
	return s.close('}')
}

// open reads the token that opens an object or a list.
func (s *scanner) open(kind jsontext.Kind) error {
	tok, err := s.dec.ReadToken()
	if err == nil && tok.Kind() != kind {
		err = errShape
	}
	return err
}

// close reads the token that closes an object or a list; anything else
// there is a value of a type the annotation does not have.
func (s *scanner) close(kind jsontext.Kind) error {
	if s.dec.PeekKind() != kind {
		return errShape
	}
	_, err := s.dec.ReadToken()
	return err
}

// text reads a string's text, valid until the next read.
func (s *scanner) text() ([]byte, error) {
	v, err := s.dec.ReadValue()
	if err != nil {
		return nil, err
	}
	if v.Kind() != '"' {
		return nil, errShape
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1], nil
	}
	return jsontext.AppendUnquote(nil, v)
}

func (s *scanner) str(p *string) error {
	t, err := s.text()
	if err == nil {
		*p = string(t)
	}
	return err
}

func (s *scanner) bool(p *bool) error {
	tok, err := s.dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 't', 'f':
		*p = tok.Bool()
		return nil
	}
	return errShape
}

func (s *scanner) strings(p *[]string) error {
	if err := s.open('['); err != nil {
		return err
	}
	list := []string{}
	for s.dec.PeekKind() == '"' {
		var e string
		if err := s.str(&e); err != nil {
			return err
		}
		list = append(list, e)
	}
	*p = list
	return s.close(']')
}
