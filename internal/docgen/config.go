package docgen

import (
	"encoding"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
)

// FieldDocs are the doc comments of the struct fields of some packages,
// read from Go source by ReadFieldDocs.
type FieldDocs struct {
	// Fields are the comments by "<import path>.<type>.<field>".
	Fields map[string]string
	// Packages are the import paths read.
	Packages map[string]bool
}

// ReadFieldDocs reads the doc comments of every struct field declared in
// the non-test Go files of each package, given as import path -> folder.
func ReadFieldDocs(packages map[string]string) (FieldDocs, error) {
	docs := FieldDocs{Fields: map[string]string{}, Packages: map[string]bool{}}
	fset := token.NewFileSet()
	for importPath, dir := range packages {
		docs.Packages[importPath] = true
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			return FieldDocs{}, err
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			src, err := os.ReadFile(name)
			if err != nil {
				return FieldDocs{}, err
			}
			f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
			if err != nil {
				return FieldDocs{}, err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return false
				}
				for _, field := range st.Fields.List {
					text := strings.TrimSpace(field.Doc.Text())
					if text == "" {
						text = strings.TrimSpace(field.Comment.Text())
					}
					for _, id := range field.Names {
						docs.Fields[importPath+"."+ts.Name.Name+"."+id.Name] = text
					}
				}
				return false
			})
		}
	}
	return docs, nil
}

// ConfigKeys renders the reference of a config file whose keys are the
// JSON names of root's fields: a row per key, by its path
// ("networkRules[].networks[].nad"), with its type and its field's doc
// comment. Structs of the packages docs was read from are opened; any
// other type (and a type that reads itself from text) is a leaf, named by
// leaves where it is there. A key without a doc comment is an error naming
// it, so the reference cannot fall behind the types silently.
func ConfigKeys(root reflect.Type, docs FieldDocs, leaves map[reflect.Type]string) (string, error) {
	var rows []string
	if err := configRows(&rows, "", root, docs, leaves); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("| key | type | what it is for |\n|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

func configRows(rows *[]string, prefix string, t reflect.Type, docs FieldDocs, leaves map[reflect.Type]string) error {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue // an embedded struct's fields are the JSON's even when its type is not exported
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" || strings.Contains(opts, "inline") {
			if err := configRows(rows, prefix, ft, docs, leaves); err != nil {
				return err
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		path := prefix + name
		doc := docs.Fields[t.PkgPath()+"."+t.Name()+"."+f.Name]
		if doc == "" {
			return fmt.Errorf("config key %s (%s.%s) has no doc comment", path, t.Name(), f.Name)
		}
		elem, list := ft, ""
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.Uint8 {
			elem, list = ft.Elem(), "list of "
			for elem.Kind() == reflect.Pointer {
				elem = elem.Elem()
			}
		}
		opened := elem.Kind() == reflect.Struct && leaves[elem] == "" && !reflect.PointerTo(elem).Implements(textUnmarshaler) && docs.Packages[elem.PkgPath()]
		typ := list + typeName(elem, leaves)
		if opened {
			typ = list + "object"
		}
		*rows = append(*rows, fmt.Sprintf("| `%s` | %s | %s |", path, typ, cell(strings.Join(strings.Fields(doc), " "))))
		if opened {
			child := path + "."
			if list != "" {
				child = path + "[]."
			}
			if err := configRows(rows, child, elem, docs, leaves); err != nil {
				return err
			}
		}
	}
	return nil
}

// typeName is a leaf's type as a config file writes it.
func typeName(t reflect.Type, leaves map[reflect.Type]string) string {
	if s := leaves[t]; s != "" {
		return s
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "JSON"
		}
		return "list of " + typeName(t.Elem(), leaves)
	case reflect.Map:
		return "map of " + typeName(t.Elem(), leaves)
	}
	return "`" + t.String() + "`"
}
