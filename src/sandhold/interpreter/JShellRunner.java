// A Java context of the code interpreter (java_context.py): one JShell (the JDK's own REPL
// engine, jdk.jshell) per context, so declarations persist from cell to cell. Cells come on
// stdin as "CELL <bytes> <env bytes>\n" + UTF-8 source + env lines ("P|C <name> <value>",
// base64: system properties, as E2B's Java kernel makes environment variables: P for the
// context's from now on, C for this cell alone); everything goes back on stdout as one line per
// event, each field base64: "O <text>" / "X <text>" (the code's stdout / stderr), "R <value>"
// (the last expression's, a String's as its text), "E <name> <message> <trace>", "D" (the cell
// is done), "READY" once. The JVM's own environment becomes system properties at start.
// Run with `java JShellRunner.java` (the JDK's source launcher: nothing to build).

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;
import java.util.stream.Collectors;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.VarSnippet;

public class JShellRunner {
    static final java.nio.charset.Charset UTF_8 = StandardCharsets.UTF_8;
    static final PrintStream CHANNEL =
            new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);

    static synchronized void send(String kind, String... fields) {
        StringBuilder line = new StringBuilder(kind);
        for (String f : fields) {
            line.append(' ').append(Base64.getEncoder().encodeToString(
                    f.getBytes(StandardCharsets.UTF_8)));
        }
        CHANNEL.println(line);
    }

    static PrintStream framed(String kind) {
        return new PrintStream(new OutputStream() {
            @Override public void write(int b) { write(new byte[] {(byte) b}, 0, 1); }
            @Override public void write(byte[] b, int off, int len) {
                send(kind, new String(b, off, len, StandardCharsets.UTF_8));
            }
        }, true, StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws IOException {
        // In this JVM ("local"): a second one (JShell's default) takes seconds more to start.
        System.getenv().forEach((k, v) -> {  // (a property of the JVM's own stays)
            if (System.getProperty(k) == null) System.setProperty(k, v);
        });
        System.setOut(framed("O"));  // (the code's System.out: CHANNEL is the real stdout)
        System.setErr(framed("X"));
        JShell shell = JShell.builder().executionEngine("local")
                .out(System.out).err(System.err).build();
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), sig -> shell.stop());
        InputStream in = new BufferedInputStream(System.in);
        send("READY");
        while (true) {
            String header = readLine(in);
            if (header == null) return;
            String[] sizes = header.substring("CELL ".length()).trim().split(" ");
            String source = new String(in.readNBytes(Integer.parseInt(sizes[0])), UTF_8);
            int envBytes = sizes.length > 1 ? Integer.parseInt(sizes[1]) : 0;
            Map<String, String> before = properties(new String(in.readNBytes(envBytes), UTF_8));
            try {
                run(shell, source);
            } finally {
                before.forEach((k, v) -> {
                    if (v == null) System.clearProperty(k); else System.setProperty(k, v);
                });
            }
            send("D");
        }
    }

    // Sets the env lines' properties; returns what the cell's own ("C") replaced, to restore.
    static Map<String, String> properties(String lines) {
        Map<String, String> before = new HashMap<>();
        for (String line : lines.split("\n")) {
            String[] f = line.split(" ");
            if (f.length != 3) continue;
            String name = decode(f[1]), value = decode(f[2]);
            if (f[0].equals("C") && !before.containsKey(name)) {
                before.put(name, System.getProperty(name));
            }
            System.setProperty(name, value);
        }
        return before;
    }

    static String decode(String field) {
        return new String(Base64.getDecoder().decode(field), UTF_8);
    }

    static String readLine(InputStream in) throws IOException {
        ByteArrayOutputStream line = new ByteArrayOutputStream();
        for (int c = in.read(); c != '\n'; c = in.read()) {
            if (c < 0) return null;
            line.write(c);
        }
        return line.toString(StandardCharsets.UTF_8);
    }

    static void run(JShell shell, String source) {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String value = null;
        String rest = source;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
            if (info.completeness() == SourceCodeAnalysis.Completeness.EMPTY) break;
            String snippet = info.completeness().isComplete() ? info.source() : rest;
            rest = info.completeness().isComplete() ? info.remaining() : "";
            for (SnippetEvent event : shell.eval(snippet)) {
                if (event.causeSnippet() != null) continue;
                if (event.exception() != null) {
                    error(event.exception());
                    return;
                }
                if (event.status() == Snippet.Status.REJECTED
                        || event.status() == Snippet.Status.RECOVERABLE_DEFINED
                        || event.status() == Snippet.Status.RECOVERABLE_NOT_DEFINED) {
                    String why = shell.diagnostics(event.snippet())
                            .map(d -> d.getMessage(null)).collect(Collectors.joining("\n"));
                    if (why.isEmpty() && event.snippet() instanceof jdk.jshell.DeclarationSnippet d) {
                        why = "cannot find symbol: " + shell.unresolvedDependencies(d)
                                .collect(Collectors.joining(", "));
                    }
                    send("E", "CompilationError", why, why);
                    return;
                }
                Snippet s = event.snippet();
                boolean expression = s.kind() == Snippet.Kind.EXPRESSION
                        || s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
                String type = s instanceof VarSnippet v ? v.typeName()
                        : s instanceof ExpressionSnippet e ? e.typeName() : "";
                value = expression ? shown(event.value(), type) : null;
            }
        }
        if (value != null) send("R", value);
    }

    // A String's value as its text (JShell gives it as a Java literal), as E2B's kernel shows it.
    static String shown(String value, String type) {
        boolean string = type.equals("String") || type.equals("java.lang.String");
        if (!string || value == null || value.length() < 2 || !value.startsWith("\"")) {
            return value;
        }
        String body = value.substring(1, value.length() - 1);
        StringBuilder out = new StringBuilder(body.length());
        for (int i = 0; i < body.length(); i++) {
            char c = body.charAt(i);
            if (c != '\\' || i + 1 == body.length()) {
                out.append(c);
                continue;
            }
            char n = body.charAt(++i);
            switch (n) {
                case 'n' -> out.append('\n');
                case 't' -> out.append('\t');
                case 'r' -> out.append('\r');
                case 'b' -> out.append('\b');
                case 'f' -> out.append('\f');
                case 's' -> out.append(' ');
                case 'u' -> {
                    out.append((char) Integer.parseInt(body.substring(i + 1, i + 5), 16));
                    i += 4;
                }
                default -> {
                    if (n >= '0' && n <= '7') {  // octal: up to three digits
                        int end = i + 1;
                        while (end < body.length() && end < i + 3
                                && body.charAt(end) >= '0' && body.charAt(end) <= '7') end++;
                        out.append((char) Integer.parseInt(body.substring(i, end), 8));
                        i = end - 1;
                    } else {
                        out.append(n);  // \\ \" \'
                    }
                }
            }
        }
        return out.toString();
    }

    static void error(JShellException e) {
        String name = e instanceof EvalException ev ? ev.getExceptionClassName()
                : e.getClass().getSimpleName();
        StringBuilder trace = new StringBuilder(name + ": " + e.getMessage());
        for (StackTraceElement frame : e.getStackTrace()) trace.append("\n\tat ").append(frame);
        send("E", name, String.valueOf(e.getMessage()), trace.toString());
    }
}
