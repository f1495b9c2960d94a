// Package sqlconst reads the SQL statements of a Go package from its
// source: Shepherd keeps SQL as Go string constants (see package bmdb),
// and a test that prepares every statement against the migrated schema
// must find them all by itself, so that a new statement cannot be left out
// of a hand-kept list.
package sqlconst

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Read parses the non-test Go files of the package in dir and returns the
// value of every constant whose name matches name, by constant name, with
// the file that declares it. A value may be a string literal, another
// constant of the package or a concatenation of those (folded here, as
// the compiler does); any other expression is an error, since a statement
// built at run time is not one a test can prepare.
func Read(dir string, name *regexp.Regexp) (sql, file map[string]string, err error) {
	return ReadImporting(dir, name, nil)
}

// ReadImporting is Read of a package whose constants also use constants
// of the packages it imports: imported has their values by qualified name
// ("bmdb.EligibleFilter"), as Read of that package returns them.
func ReadImporting(dir string, name *regexp.Regexp, imported map[string]string) (sql, file map[string]string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlconst: %w", err)
	}
	fset := token.NewFileSet()
	exprs := map[string]ast.Expr{}
	files := map[string]string{}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("sqlconst: %w", err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i < len(vs.Values) {
						exprs[id.Name] = vs.Values[i]
						files[id.Name] = n
					}
				}
			}
		}
	}
	sql, file = map[string]string{}, map[string]string{}
	for n, e := range exprs {
		if !name.MatchString(n) {
			continue
		}
		s, err := eval(exprs, imported, e)
		if err != nil {
			return nil, nil, fmt.Errorf("sqlconst: constant %s (%s): %w", n, files[n], err)
		}
		sql[n], file[n] = s, files[n]
	}
	return sql, file, nil
}

// eval folds a constant string expression.
func eval(consts map[string]ast.Expr, imported map[string]string, e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", fmt.Errorf("not a string: %s", e.Value)
		}
		return strconv.Unquote(e.Value)
	case *ast.Ident:
		x, ok := consts[e.Name]
		if !ok {
			return "", fmt.Errorf("unknown constant %s", e.Name)
		}
		return eval(consts, imported, x)
	case *ast.SelectorExpr:
		pkg, ok := e.X.(*ast.Ident)
		if !ok {
			return "", fmt.Errorf("not a constant of an imported package: %T", e.X)
		}
		v, ok := imported[pkg.Name+"."+e.Sel.Name]
		if !ok {
			return "", fmt.Errorf("unknown constant %s.%s", pkg.Name, e.Sel.Name)
		}
		return v, nil
	case *ast.ParenExpr:
		return eval(consts, imported, e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", fmt.Errorf("not a concatenation: %s", e.Op)
		}
		x, err := eval(consts, imported, e.X)
		if err != nil {
			return "", err
		}
		y, err := eval(consts, imported, e.Y)
		return x + y, err
	default:
		return "", fmt.Errorf("not a string constant expression: %T", e)
	}
}
