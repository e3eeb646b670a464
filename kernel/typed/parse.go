package typed

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// node is a parsed expression.
type node interface{ String() string }

type (
	ident  struct{ name string }
	number struct{ v uint64 }
	member struct {
		x     node
		name  string
		arrow bool // x->name, else x.name
	}
	index struct{ x, i node }
	unary struct {
		op byte // '*', '&', '-'
		x  node
	}
	binop struct {
		op   byte // '+', '-'
		x, y node
	}
	cast struct {
		t typeName
		x node
	}
	sizeof struct {
		t *typeName // sizeof(type)
		x node      // sizeof expr
	}
	containerOf struct {
		x      node
		t      typeName
		member string
	}
	perCPU struct {
		x   node
		cpu node
	}
)

// typeName is a C type as written in a cast: a struct, union, enum,
// typedef or base type, then pointers.
type typeName struct {
	kind  string // "struct", "union", "enum" or "" (a typedef or base type)
	name  string
	stars int
}

func (t typeName) String() string {
	s := t.name
	if t.kind != "" {
		s = t.kind + " " + s
	}
	if t.stars > 0 {
		s += " " + strings.Repeat("*", t.stars)
	}
	return s
}

func (n ident) String() string  { return n.name }
func (n number) String() string { return fmt.Sprintf("%#x", n.v) }
func (n member) String() string {
	if n.arrow {
		return n.x.String() + "->" + n.name
	}
	return n.x.String() + "." + n.name
}
func (n index) String() string { return n.x.String() + "[" + n.i.String() + "]" }
func (n unary) String() string { return string(n.op) + n.x.String() }
func (n binop) String() string { return n.x.String() + " " + string(n.op) + " " + n.y.String() }
func (n cast) String() string  { return "(" + n.t.String() + ")" + n.x.String() }
func (n sizeof) String() string {
	if n.t != nil {
		return "sizeof(" + n.t.String() + ")"
	}
	return "sizeof(" + n.x.String() + ")"
}
func (n containerOf) String() string {
	return "container_of(" + n.x.String() + ", " + n.t.String() + ", " + n.member + ")"
}
func (n perCPU) String() string { return "per_cpu(" + n.x.String() + ", " + n.cpu.String() + ")" }

// SyntaxError is an expression kinst cannot parse; Pos is the byte
// offset of the problem.
type SyntaxError struct {
	Expr string
	Pos  int
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s at column %d of %q", e.Msg, e.Pos+1, e.Expr)
}

// token is one lexeme: an identifier, a number or punctuation.
type token struct {
	s   string
	pos int
}

func lex(expr string) ([]token, error) {
	var out []token
	for i := 0; i < len(expr); {
		c := rune(expr[i])
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '_' || unicode.IsLetter(c):
			j := i
			for j < len(expr) && (expr[j] == '_' || unicode.IsLetter(rune(expr[j])) || unicode.IsDigit(rune(expr[j]))) {
				j++
			}
			out = append(out, token{expr[i:j], i})
			i = j
		case unicode.IsDigit(c):
			j := i
			for j < len(expr) && (unicode.IsDigit(rune(expr[j])) || unicode.IsLetter(rune(expr[j]))) {
				j++
			}
			out = append(out, token{expr[i:j], i})
			i = j
		case strings.HasPrefix(expr[i:], "->"):
			out = append(out, token{"->", i})
			i += 2
		case strings.ContainsRune("().[]*&+-,", c):
			out = append(out, token{string(c), i})
			i++
		default:
			return nil, &SyntaxError{Expr: expr, Pos: i, Msg: fmt.Sprintf("unexpected %q", c)}
		}
	}
	return out, nil
}

// parser is a recursive-descent parser of the expressions p accepts:
//
//	expr    = unary { ("+" | "-") unary }
//	unary   = ("*" | "&" | "-") unary | "(" type ")" unary | postfix
//	postfix = primary { "." name | "->" name | "[" expr "]" }
//	primary = name | number | "(" expr ")" | sizeof | container_of | per_cpu
type parser struct {
	expr string
	toks []token
	i    int
}

// Parse parses expr.
func parse(expr string) (node, error) {
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	p := &parser{expr: expr, toks: toks}
	if len(toks) == 0 {
		return nil, p.errorf("empty expression")
	}
	n, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if p.i < len(p.toks) {
		return nil, p.errorf("unexpected %q", p.toks[p.i].s)
	}
	return n, nil
}

func (p *parser) peek() string {
	if p.i < len(p.toks) {
		return p.toks[p.i].s
	}
	return ""
}

func (p *parser) errorf(format string, args ...any) error {
	pos := len(p.expr)
	if p.i < len(p.toks) {
		pos = p.toks[p.i].pos
	}
	return &SyntaxError{Expr: p.expr, Pos: pos, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) expect(s string) error {
	if p.peek() != s {
		if p.peek() == "" {
			return p.errorf("want %q, the expression ends", s)
		}
		return p.errorf("want %q, not %q", s, p.peek())
	}
	p.i++
	return nil
}

func (p *parser) parseExpr() (node, error) {
	x, err := p.parseUnary()
	if err != nil {
		return nil, err
	}
	for p.peek() == "+" || p.peek() == "-" {
		op := p.peek()[0]
		p.i++
		y, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		x = binop{op: op, x: x, y: y}
	}
	return x, nil
}

func (p *parser) parseUnary() (node, error) {
	switch t := p.peek(); t {
	case "*", "&", "-":
		p.i++
		x, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		return unary{op: t[0], x: x}, nil
	case "(":
		if p.startsType(p.i + 1) {
			p.i++
			tn, err := p.parseType()
			if err != nil {
				return nil, err
			}
			if err := p.expect(")"); err != nil {
				return nil, err
			}
			x, err := p.parseUnary()
			if err != nil {
				return nil, err
			}
			return cast{t: tn, x: x}, nil
		}
	}
	return p.parsePostfix()
}

// startsType says whether the token at i begins a type name: a cast,
// not a parenthesised expression.
func (p *parser) startsType(i int) bool {
	if i >= len(p.toks) {
		return false
	}
	switch s := p.toks[i].s; s {
	case "struct", "union", "enum", "unsigned", "signed", "char", "short", "int", "long", "void", "_Bool", "bool":
		return true
	default:
		// A typedef name: "(u64)x", "(pid_t)x" -- an identifier
		// followed by ")" or "*" and then something to cast.
		if !isIdent(s) || i+1 >= len(p.toks) {
			return false
		}
		next := p.toks[i+1].s
		if next == "*" {
			return true
		}
		return next == ")" && i+2 < len(p.toks) && !strings.Contains(")].,+-", p.toks[i+2].s) && p.toks[i+2].s != "->"
	}
}

func isIdent(s string) bool {
	return s != "" && (s[0] == '_' || unicode.IsLetter(rune(s[0])))
}

// parseType parses a type name: "struct task_struct *", "unsigned long",
// "u64".
func (p *parser) parseType() (typeName, error) {
	var t typeName
	switch s := p.peek(); s {
	case "struct", "union", "enum":
		p.i++
		if !isIdent(p.peek()) {
			return t, p.errorf("want a %s name", s)
		}
		t.kind, t.name = s, p.peek()
		p.i++
	default:
		var words []string
		for isIdent(p.peek()) && (len(words) == 0 || baseWord(p.peek())) {
			words = append(words, p.peek())
			p.i++
			if !baseWord(words[0]) {
				break // a typedef is one word
			}
		}
		if len(words) == 0 {
			return t, p.errorf("want a type")
		}
		t.name = strings.Join(words, " ")
	}
	for p.peek() == "*" {
		t.stars++
		p.i++
	}
	return t, nil
}

func baseWord(s string) bool {
	switch s {
	case "unsigned", "signed", "char", "short", "int", "long", "void", "_Bool", "bool":
		return true
	}
	return false
}

func (p *parser) parsePostfix() (node, error) {
	x, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	for {
		switch p.peek() {
		case ".", "->":
			arrow := p.peek() == "->"
			p.i++
			if !isIdent(p.peek()) {
				return nil, p.errorf("want a member name")
			}
			x = member{x: x, name: p.peek(), arrow: arrow}
			p.i++
		case "[":
			p.i++
			i, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if err := p.expect("]"); err != nil {
				return nil, err
			}
			x = index{x: x, i: i}
		default:
			return x, nil
		}
	}
}

func (p *parser) parsePrimary() (node, error) {
	t := p.peek()
	switch {
	case t == "":
		return nil, p.errorf("the expression ends too soon")
	case t == "(":
		p.i++
		x, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		return x, p.expect(")")
	case t == "sizeof":
		p.i++
		if p.peek() == "(" && p.startsType(p.i+1) {
			p.i++
			tn, err := p.parseType()
			if err != nil {
				return nil, err
			}
			return sizeof{t: &tn}, p.expect(")")
		}
		x, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		return sizeof{x: x}, nil
	case t == "container_of":
		p.i++
		var x node
		var tn typeName
		var path []string
		err := p.args(
			func() (err error) { x, err = p.parseExpr(); return err },
			func() (err error) { tn, err = p.parseType(); return err },
			func() error {
				for {
					if !isIdent(p.peek()) {
						return p.errorf("want a member name")
					}
					path = append(path, p.peek())
					p.i++
					if p.peek() != "." {
						return nil
					}
					p.i++
				}
			})
		return containerOf{x: x, t: tn, member: strings.Join(path, ".")}, err
	case t == "per_cpu":
		p.i++
		var x, cpu node
		err := p.args(
			func() (err error) { x, err = p.parseExpr(); return err },
			func() (err error) { cpu, err = p.parseExpr(); return err })
		return perCPU{x: x, cpu: cpu}, err
	case isIdent(t):
		p.i++
		return ident{name: t}, nil
	case t[0] >= '0' && t[0] <= '9':
		v, err := strconv.ParseUint(strings.TrimRight(strings.ToLower(t), "ul"), 0, 64)
		if err != nil {
			return nil, p.errorf("bad number %q", t)
		}
		p.i++
		return number{v: v}, nil
	}
	return nil, p.errorf("unexpected %q", t)
}

// args parses a parenthesised, comma-separated argument list, one
// parser for each argument.
func (p *parser) args(each ...func() error) error {
	if err := p.expect("("); err != nil {
		return err
	}
	for i, parse := range each {
		if i > 0 {
			if err := p.expect(","); err != nil {
				return err
			}
		}
		if err := parse(); err != nil {
			return err
		}
	}
	return p.expect(")")
}
