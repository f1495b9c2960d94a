package bmdb

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// statementName is how a constant says it is a statement: qName for one
// run as it is, nameTemplate for one that splices a process's condition.
var statementName = regexp.MustCompile(`^(q[A-Z]\w*|\w+Template)$`)

// SQLStatements derives from this package's source every SQL statement
// constant, by name, ready to prepare, with the file that declares it: constants built from others are
// folded, and templates get Recovery's condition (which has a due time, so
// both placeholders are filled). queries_test.go prepares them all, so
// that a renamed column fails a fast test, not a path at run time; the
// list is read from the source, so a new statement cannot be forgotten.
func SQLStatements() (sql, file map[string]string, err error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		return nil, nil, err
	}
	exprs := map[string]ast.Expr{}
	files := map[string]string{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			return nil, nil, err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						exprs[n.Name] = vs.Values[i]
						files[n.Name] = name
					}
				}
			}
		}
	}
	var eval func(e ast.Expr) (string, error)
	eval = func(e ast.Expr) (string, error) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", fmt.Errorf("not a string: %s", e.Value)
			}
			return strconv.Unquote(e.Value)
		case *ast.Ident:
			x, ok := exprs[e.Name]
			if !ok {
				return "", fmt.Errorf("unknown constant %s", e.Name)
			}
			return eval(x)
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", fmt.Errorf("not a concatenation: %s", e.Op)
			}
			x, err := eval(e.X)
			if err != nil {
				return "", err
			}
			y, err := eval(e.Y)
			return x + y, err
		default:
			return "", fmt.Errorf("not a string constant expression: %T", e)
		}
	}
	recovery := RecoveryCandidates(30*time.Minute, 10*time.Minute)
	sql, file = map[string]string{}, map[string]string{}
	for name, e := range exprs {
		if !statementName.MatchString(name) {
			continue
		}
		s, err := eval(e)
		if err != nil {
			return nil, nil, fmt.Errorf("constant %s: %w", name, err)
		}
		if strings.HasSuffix(name, "Template") {
			s, _ = recovery.query(s, nil)
		}
		sql[name], file[name] = s, files[name]
	}
	return sql, file, nil
}
