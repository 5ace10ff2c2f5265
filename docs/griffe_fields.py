"""A Griffe extension for the book's API pages (mkdocs.yml names it): each field that a class's
Google-style `Attributes:` section describes gets that description as its own docstring, under its
own heading, and leaves the section. A config class so shows each field once (its heading, its type
and default, what it means) instead of a table of descriptions followed by the same fields again as
headings with nothing under them."""

import griffe


class AttributesToFields(griffe.Extension):
    def on_class(self, *, cls: griffe.Class, **kwargs) -> None:
        """Move each `Attributes:` item that names one of the class's own attributes onto that
        attribute."""
        if cls.docstring is None:
            return
        sections = cls.docstring.parsed  # cached: what the page's template renders
        for section in [s for s in sections if s.kind is griffe.DocstringSectionKind.attributes]:
            kept = []
            for item in section.value:
                member = cls.members.get(item.name)
                if (
                    member is None
                    or member.is_alias
                    or not member.is_attribute
                    or member.docstring
                    or not item.description
                ):
                    kept.append(item)
                    continue
                member.docstring = griffe.Docstring(
                    item.description,
                    parent=member,
                    parser=cls.docstring.parser,
                    parser_options=cls.docstring.parser_options,
                )
            section.value[:] = kept
            if not kept:
                sections.remove(section)
