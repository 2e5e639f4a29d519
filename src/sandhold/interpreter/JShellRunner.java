// A Java context of the code interpreter (java_context.py): one JShell (the JDK's own REPL
// engine, jdk.jshell) per context, so declarations persist from cell to cell. Cells come on
// stdin as "CELL <bytes>\n" + UTF-8 source; everything goes back on stdout as one line per event,
// each field base64: "O <text>" / "X <text>" (the code's stdout / stderr), "R <value>" (the last
// expression's), "E <name> <message> <trace>", "D" (the cell is done), "READY" once.
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
import java.util.stream.Collectors;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;

public class JShellRunner {
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
            int size = Integer.parseInt(header.substring("CELL ".length()).trim());
            run(shell, new String(in.readNBytes(size), StandardCharsets.UTF_8));
            send("D");
        }
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
                value = expression ? event.value() : null;
            }
        }
        if (value != null) send("R", value);
    }

    static void error(JShellException e) {
        String name = e instanceof EvalException ev ? ev.getExceptionClassName()
                : e.getClass().getSimpleName();
        StringBuilder trace = new StringBuilder(name + ": " + e.getMessage());
        for (StackTraceElement frame : e.getStackTrace()) trace.append("\n\tat ").append(frame);
        send("E", name, String.valueOf(e.getMessage()), trace.toString());
    }
}
