package workspace

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"agentkit/model"
	"agentkit/tool"
)

// Names of the tools Tools returns.
const (
	ListFiles   = "list_files"
	ReadFile    = "read_file"
	WriteFile   = "write_file"
	SearchFiles = "search_files"
)

// Defaults of Options.
const (
	DefaultMaxReadBytes   = 64 << 10
	DefaultMaxOutputBytes = 32 << 10
	DefaultMaxWriteBytes  = 1 << 20
	DefaultMaxMatches     = 200
	DefaultMaxEntries     = 1000
)

// Bounds that are not options.
const (
	maxLineShown      = 300       // search_files shows at most this much of a line
	maxSearchFileSize = 64 << 20  // search_files skips larger files
	maxCountBytes     = 256 << 20 // read_file stops counting lines after this
	binarySniff       = 8 << 10   // a NUL in the first 8 KiB means binary
)

// Options configures the file tools. The zero value is usable: no memory
// view mounted (memory/ is then read-only in the workspace itself) and the
// default limits.
type Options struct {
	// MemoryDir is a host folder (the runtime passes --state-root/memory)
	// shown read-only at memory/ inside every workspace. Paths under
	// memory/ are served from it through its own os.Root; a workspace's own
	// memory/ folder, if any, is hidden. A missing folder shows as an empty
	// memory/. When empty, memory/ refers to the workspace's own folder and
	// is still read-only to write_file.
	MemoryDir string
	// MaxReadBytes bounds what read_file returns per call; zero means
	// DefaultMaxReadBytes.
	MaxReadBytes int
	// MaxOutputBytes bounds the output of list_files and search_files; zero
	// means DefaultMaxOutputBytes.
	MaxOutputBytes int
	// MaxWriteBytes bounds the content write_file accepts; zero means
	// DefaultMaxWriteBytes.
	MaxWriteBytes int
	// MaxMatches bounds the matches search_files reports; zero means
	// DefaultMaxMatches.
	MaxMatches int
	// MaxEntries bounds the entries list_files reports; zero means
	// DefaultMaxEntries.
	MaxEntries int
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxReadBytes, DefaultMaxReadBytes)
	def(&o.MaxOutputBytes, DefaultMaxOutputBytes)
	def(&o.MaxWriteBytes, DefaultMaxWriteBytes)
	def(&o.MaxMatches, DefaultMaxMatches)
	def(&o.MaxEntries, DefaultMaxEntries)
	return o
}

// Tools returns list_files, read_file, write_file and search_files over
// env.Workspace, with memory/ served as opts says. The tools hold no state
// and are safe for concurrent use.
func Tools(opts Options) []tool.Tool {
	t := &tools{opts: opts.withDefaults()}
	return []tool.Tool{
		{Spec: model.ToolSpec{
			Name:        ListFiles,
			Description: "List the files and folders at a path in the workspace (default: the workspace itself). Folders end in /. Set recursive to list everything below. memory/ holds the agent's memory journal, read-only.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"Folder relative to the workspace; default ."},"recursive":{"type":"boolean","description":"List every file below the folder"}},"additionalProperties":false}`),
		}, Run: t.list},
		{Spec: model.ToolSpec{
			Name:        ReadFile,
			Description: "Read a text file in the workspace. offset (1-based line) and limit (number of lines) read part of a long file; long output is cut with a note saying how to continue.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"File relative to the workspace"},"offset":{"type":"integer","minimum":1,"description":"First line to read, from 1"},"limit":{"type":"integer","minimum":1,"description":"Most lines to read"}},"required":["path"],"additionalProperties":false}`),
		}, Run: t.read},
		{Spec: model.ToolSpec{
			Name:        WriteFile,
			Description: "Write a text file in the workspace, replacing it if it exists and creating its folders. memory/ is read-only.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"File relative to the workspace"},"content":{"type":"string","description":"The whole new content"}},"required":["path","content"],"additionalProperties":false}`),
		}, Run: t.write},
		{Spec: model.ToolSpec{
			Name:        SearchFiles,
			Description: "Search the text files under a path (default: the whole workspace, memory/ included) for a substring, or a regular expression when regexp is true. Answers path:line: text, one match a line.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"pattern":{"type":"string","description":"Text to find"},"path":{"type":"string","description":"Folder or file to search; default ."},"regexp":{"type":"boolean","description":"Treat pattern as a Go regular expression"},"ignore_case":{"type":"boolean","description":"Match regardless of case"}},"required":["pattern"],"additionalProperties":false}`),
		}, Run: t.search},
	}
}

type tools struct{ opts Options }

// decodeArgs reads a tool's JSON arguments strictly, so the model learns of
// misspelt fields.
func decodeArgs(name string, raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: the arguments do not fit (%v); see the tool's parameters", name, err)
	}
	return nil
}

// source is one tree the tools read from: the workspace or the memory view.
type source struct {
	root   *os.Root // nil: an empty tree (a memory folder not created yet)
	rel    string   // the path inside root
	prefix string   // "" or "memory/": prepended to paths inside root
	skip   string   // a top-level name to hide ("memory" when mounted)
}

// show turns a path inside the source's root into a workspace path.
func (s source) show(p string) string {
	if s.prefix == "" {
		return p
	}
	if p == "." {
		return strings.TrimSuffix(s.prefix, "/")
	}
	return s.prefix + p
}

// sources resolves a cleaned path to the trees that hold it. The returned
// func closes what was opened.
func (t *tools) sources(env *tool.Env, clean string) ([]source, func(), error) {
	if env == nil || env.Workspace == nil {
		return nil, func() {}, errors.New("this session has no workspace")
	}
	ws := source{root: env.Workspace, rel: clean}
	if t.opts.MemoryDir == "" {
		return []source{ws}, func() {}, nil
	}
	rest, inMemory := underMemory(clean)
	if !inMemory && clean != "." {
		return []source{ws}, func() {}, nil
	}
	mem := source{prefix: MemoryDir + "/", rel: rest}
	r, err := os.OpenRoot(t.opts.MemoryDir)
	switch {
	case err == nil:
		mem.root = r
	case errors.Is(err, fs.ErrNotExist):
	default:
		return nil, func() {}, fmt.Errorf("the memory journal folder cannot be opened: %v", err)
	}
	closeMem := func() {
		if r != nil {
			r.Close()
		}
	}
	if inMemory {
		return []source{mem}, closeMem, nil
	}
	// The workspace itself: its entries, with the memory view in place of
	// any memory/ of its own.
	ws.skip = MemoryDir
	mem.rel = "."
	return []source{ws, mem}, closeMem, nil
}

// entry is one line of a listing.
type entry struct {
	path string
	dir  bool
	link bool
	size int64
}

func (t *tools) list(ctx context.Context, env *tool.Env, raw json.RawMessage) (string, error) {
	var args struct {
		Path      string `json:"path"`
		Recursive bool   `json:"recursive"`
	}
	if err := decodeArgs(ListFiles, raw, &args); err != nil {
		return "", err
	}
	if args.Path == "" {
		args.Path = "."
	}
	clean, err := CleanPath(args.Path)
	if err != nil {
		return "", err
	}
	srcs, done, err := t.sources(env, clean)
	defer done()
	if err != nil {
		return "", err
	}
	var entries []entry
	more := false
	for _, s := range srcs {
		if s.root == nil {
			if s.rel != "." {
				return "", fmt.Errorf("%s does not exist; the memory journal has no such entry yet", s.show(s.rel))
			}
			if s.prefix != "" && clean == "." {
				entries = append(entries, entry{path: MemoryDir, dir: true})
			}
			continue
		}
		if s.prefix != "" && clean == "." {
			entries = append(entries, entry{path: MemoryDir, dir: true})
			if !args.Recursive {
				continue
			}
		}
		err := fs.WalkDir(s.root.FS(), s.rel, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			if p == s.rel {
				if d.IsDir() {
					return nil
				}
				// A file: list just it.
			} else if s.skip != "" && s.rel == "." && path.Dir(p) == "." && p == s.skip {
				return fs.SkipDir
			}
			if len(entries) >= t.opts.MaxEntries {
				more = true
				return fs.SkipAll
			}
			e := entry{path: s.show(p), dir: d.IsDir(), link: d.Type()&fs.ModeSymlink != 0}
			if !e.dir && !e.link {
				if info, err := d.Info(); err == nil {
					e.size = info.Size()
				}
			}
			entries = append(entries, e)
			if d.IsDir() && !args.Recursive {
				return fs.SkipDir
			}
			return nil
		})
		if err != nil {
			return "", fsError(s.show(s.rel), err)
		}
	}
	slices.SortFunc(entries, func(a, b entry) int { return comparePaths(a.path, b.path) })
	if len(entries) > t.opts.MaxEntries {
		entries, more = entries[:t.opts.MaxEntries], true
	}
	if len(entries) == 0 {
		return clean + " is an empty folder", nil
	}
	var b strings.Builder
	shown := 0
	for _, e := range entries {
		var line string
		switch {
		case e.dir:
			line = e.path + "/"
		case e.link:
			line = e.path + " (symlink)"
		default:
			line = fmt.Sprintf("%s (%d bytes)", e.path, e.size)
		}
		if b.Len()+len(line)+1 > t.opts.MaxOutputBytes {
			more = true
			break
		}
		b.WriteString(line)
		b.WriteByte('\n')
		shown++
	}
	if more {
		fmt.Fprintf(&b, "[list cut after %d entries; list a subfolder to see the rest]\n", shown)
	}
	return b.String(), nil
}

// comparePaths orders slash-separated paths component by component, so a
// folder's contents follow it directly.
func comparePaths(a, b string) int {
	for {
		ah, at, amore := strings.Cut(a, "/")
		bh, bt, bmore := strings.Cut(b, "/")
		if c := strings.Compare(ah, bh); c != 0 {
			return c
		}
		switch {
		case !amore && !bmore:
			return 0
		case !amore:
			return -1
		case !bmore:
			return 1
		}
		a, b = at, bt
	}
}

// file opens a regular file at a cleaned path for reading.
func (t *tools) file(env *tool.Env, clean string) (*os.File, source, func(), error) {
	srcs, done, err := t.sources(env, clean)
	if err != nil {
		done()
		return nil, source{}, nil, err
	}
	s := srcs[0]
	if s.root == nil {
		done()
		return nil, s, nil, fmt.Errorf("%s does not exist; the memory journal has no records yet", clean)
	}
	if st, err := s.root.Stat(s.rel); err == nil && st.IsDir() {
		done()
		return nil, s, nil, fmt.Errorf("%s is a folder; use %s to see inside it", clean, ListFiles)
	}
	f, err := openRegular(s.root, s.rel, clean, os.O_RDONLY, 0)
	if err != nil {
		done()
		return nil, s, nil, err
	}
	return f, s, func() { f.Close(); done() }, nil
}

func (t *tools) read(ctx context.Context, env *tool.Env, raw json.RawMessage) (string, error) {
	var args struct {
		Path   string `json:"path"`
		Offset int    `json:"offset"`
		Limit  int    `json:"limit"`
	}
	if err := decodeArgs(ReadFile, raw, &args); err != nil {
		return "", err
	}
	if args.Offset < 0 || args.Limit < 0 {
		return "", fmt.Errorf("%s: offset and limit count lines from 1; negative values are not allowed", ReadFile)
	}
	clean, err := CleanPath(args.Path)
	if err != nil {
		return "", err
	}
	if clean == "." {
		return "", fmt.Errorf("%s: give a file path; use %s to see the workspace", ReadFile, ListFiles)
	}
	f, _, done, err := t.file(env, clean)
	if err != nil {
		return "", err
	}
	defer done()
	br := bufio.NewReaderSize(f, 64<<10)
	if head, _ := br.Peek(binarySniff); bytes.IndexByte(head, 0) >= 0 {
		info, _ := f.Stat()
		return "", fmt.Errorf("%s is a binary file (%d bytes); %s shows text only", clean, info.Size(), ReadFile)
	}
	r := lineReader{offset: max(args.Offset, 1), limit: args.Limit, maxBytes: t.opts.MaxReadBytes}
	if err := r.run(ctx, br); err != nil {
		return "", fsError(clean, err)
	}
	return r.result(clean), nil
}

// lineReader copies lines offset..offset+limit-1 of a file, up to maxBytes,
// and counts the file's lines.
type lineReader struct {
	offset, limit, maxBytes int

	out       []byte
	first     int  // first line copied (0: none)
	last      int  // last line copied, whole or in part
	lines     int  // lines in the file (counted up to maxCountBytes)
	counted   bool // lines is exact
	full      bool // maxBytes was reached
	cutInLine bool // the last line copied was cut
}

func (r *lineReader) run(ctx context.Context, br *bufio.Reader) error {
	line := 1       // the line the next byte belongs to
	inLine := false // bytes of the current line were seen
	stop := false   // no more copying
	var scanned int64
	for {
		chunk, err := br.ReadSlice('\n')
		scanned += int64(len(chunk))
		if len(chunk) > 0 {
			inLine = true
			wanted := line >= r.offset && (r.limit == 0 || line < r.offset+r.limit)
			if wanted && !stop {
				if len(r.out)+len(chunk) <= r.maxBytes {
					r.out = append(r.out, chunk...)
					if r.first == 0 {
						r.first = line
					}
					r.last = line
				} else {
					stop, r.full = true, true
					if r.first == 0 || r.last == line {
						// Not one whole line fits: show the start of this one.
						room := r.maxBytes - len(r.out)
						for room > 0 && !utf8.RuneStart(chunk[room]) {
							room--
						}
						r.out = append(r.out, chunk[:room]...)
						if r.first == 0 {
							r.first = line
						}
						r.last, r.cutInLine = line, true
					}
				}
			} else if !wanted && line >= r.offset {
				stop = true
			}
			if chunk[len(chunk)-1] == '\n' {
				line++
				inLine = false
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil && err != bufio.ErrBufferFull {
			return err
		}
		if scanned > maxCountBytes && stop {
			r.lines = line - 1
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
	}
	r.lines = line - 1
	if inLine {
		r.lines++
	}
	r.counted = true
	return nil
}

func (r *lineReader) result(shown string) string {
	total := fmt.Sprintf("%d", r.lines)
	if !r.counted {
		total = fmt.Sprintf("more than %d", r.lines)
	}
	if r.first == 0 {
		if r.lines == 0 && r.counted {
			return ""
		}
		return fmt.Sprintf("[%s has %s lines; offset %d is past the end]", shown, total, r.offset)
	}
	out := string(r.out)
	partial := r.first > 1 || r.last < r.lines || !r.counted || r.cutInLine
	if !partial {
		return out
	}
	if !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	next := r.last + 1
	switch {
	case r.cutInLine:
		out += fmt.Sprintf("[cut: line %d is longer than %d bytes; showed lines %d-%d of %s; continue with offset=%d]", r.last, r.maxBytes, r.first, r.last, total, next)
	case r.full:
		out += fmt.Sprintf("[cut at %d bytes: showed lines %d-%d of %s; continue with offset=%d]", r.maxBytes, r.first, r.last, total, next)
	case r.last < r.lines || !r.counted:
		out += fmt.Sprintf("[showed lines %d-%d of %s; continue with offset=%d]", r.first, r.last, total, next)
	default:
		out += fmt.Sprintf("[showed lines %d-%d of %s]", r.first, r.last, total)
	}
	return out
}

func (t *tools) write(ctx context.Context, env *tool.Env, raw json.RawMessage) (string, error) {
	var args struct {
		Path    *string `json:"path"`
		Content *string `json:"content"`
	}
	if err := decodeArgs(WriteFile, raw, &args); err != nil {
		return "", err
	}
	if args.Path == nil || args.Content == nil {
		return "", fmt.Errorf("%s needs both path and content", WriteFile)
	}
	clean, err := CleanPath(*args.Path)
	if err != nil {
		return "", err
	}
	switch {
	case clean == ".":
		return "", fmt.Errorf("%s: give a file path, not the workspace itself", WriteFile)
	case IsReserved(clean):
		return "", fmt.Errorf("%s: %s is under memory/, the read-only view of the memory journal; write somewhere else, such as notes/", WriteFile, clean)
	case len(*args.Content) > t.opts.MaxWriteBytes:
		return "", fmt.Errorf("%s: %d bytes is over the %d-byte limit; write a smaller file", WriteFile, len(*args.Content), t.opts.MaxWriteBytes)
	case env == nil || env.Workspace == nil:
		return "", errors.New("this session has no workspace")
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	root := env.Workspace
	if dir := path.Dir(clean); dir != "." {
		if err := root.MkdirAll(dir, dirPerm); err != nil {
			return "", fsError(dir, err)
		}
	}
	if info, err := root.Stat(clean); err == nil && info.IsDir() {
		return "", fmt.Errorf("%s is a folder; give a file path", clean)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if err := writeRegular(root, clean, clean, []byte(*args.Content)); err != nil {
		return "", err
	}
	return fmt.Sprintf("wrote %d bytes to %s", len(*args.Content), clean), nil
}

var errStop = errors.New("stop")

func (t *tools) search(ctx context.Context, env *tool.Env, raw json.RawMessage) (string, error) {
	var args struct {
		Pattern    string `json:"pattern"`
		Path       string `json:"path"`
		Regexp     bool   `json:"regexp"`
		IgnoreCase bool   `json:"ignore_case"`
	}
	if err := decodeArgs(SearchFiles, raw, &args); err != nil {
		return "", err
	}
	if args.Pattern == "" {
		return "", fmt.Errorf("%s: the pattern is empty; give the text to find", SearchFiles)
	}
	if args.Path == "" {
		args.Path = "."
	}
	clean, err := CleanPath(args.Path)
	if err != nil {
		return "", err
	}
	expr := args.Pattern
	if !args.Regexp {
		expr = regexp.QuoteMeta(expr)
	}
	if args.IgnoreCase {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return "", fmt.Errorf("%s: the pattern is not a valid regular expression: %v", SearchFiles, err)
	}
	srcs, done, err := t.sources(env, clean)
	defer done()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	matches, skipped := 0, 0
	cut := false
	for _, s := range srcs {
		if s.root == nil {
			if s.rel != "." {
				return "", fmt.Errorf("%s does not exist; the memory journal has no such entry yet", s.show(s.rel))
			}
			continue
		}
		err := fs.WalkDir(s.root.FS(), s.rel, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			if s.skip != "" && s.rel == "." && p == s.skip {
				return fs.SkipDir
			}
			if !d.Type().IsRegular() {
				return nil
			}
			info, err := d.Info()
			if err != nil || info.Size() > maxSearchFileSize {
				skipped++
				return nil
			}
			f, err := openRegular(s.root, p, s.show(p), os.O_RDONLY, 0)
			if err != nil {
				skipped++
				return nil
			}
			defer f.Close()
			br := bufio.NewReaderSize(f, 64<<10)
			if head, _ := br.Peek(binarySniff); bytes.IndexByte(head, 0) >= 0 {
				return nil // binary
			}
			n := 0
			for {
				if n%4096 == 0 {
					if cerr := ctx.Err(); cerr != nil {
						return cerr
					}
				}
				line, rerr := br.ReadSlice('\n')
				long := rerr == bufio.ErrBufferFull
				if len(line) > 0 {
					n++
					text := strings.TrimRight(string(line), "\r\n")
					if re.MatchString(text) {
						out := fmt.Sprintf("%s:%d: %s\n", s.show(p), n, clipLine(text))
						if matches >= t.opts.MaxMatches || b.Len()+len(out) > t.opts.MaxOutputBytes {
							cut = true
							return errStop
						}
						b.WriteString(out)
						matches++
					}
					for long {
						// The rest of an over-long line: skip it.
						_, rerr = br.ReadSlice('\n')
						long = rerr == bufio.ErrBufferFull
					}
				}
				if rerr == io.EOF {
					return nil
				}
				if rerr != nil {
					skipped++
					return nil
				}
			}
		})
		if errors.Is(err, errStop) {
			break
		}
		if err != nil {
			return "", fsError(s.show(s.rel), err)
		}
	}
	if matches == 0 && !cut {
		return fmt.Sprintf("no matches for %q under %s", args.Pattern, clean), nil
	}
	if cut {
		fmt.Fprintf(&b, "[stopped after %d matches; narrow the pattern or the path]\n", matches)
	}
	if skipped > 0 {
		fmt.Fprintf(&b, "[%d files could not be searched (unreadable or over %d MiB)]\n", skipped, maxSearchFileSize>>20)
	}
	return b.String(), nil
}

// clipLine cuts a matching line for display, on a rune boundary.
func clipLine(s string) string {
	if len(s) <= maxLineShown {
		return s
	}
	n := maxLineShown
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
